//! What a document selects once every fragment spread is expanded, counted without
//! expanding it: each fragment counted once and remembered, so a document whose spreads
//! would expand exponentially costs linear work, and cycles are refused.

use std::collections::HashMap;

use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};

use super::limits::{LimitError, MAX_EXPANDED_SELECTIONS, MAX_FRAGMENT_DEPTH, MAX_ROOT_FIELDS};

/// Counts what a parsed document selects with every fragment expanded, each fragment
/// counted once and remembered, so exponential spreads cost linear work.
pub fn check_document(document: &ExecutableDocument) -> Result<(), LimitError> {
    let mut counter = ExpansionCounter {
        document,
        memo: HashMap::new(),
        in_progress: Vec::new(),
    };
    let mut total = 0u64;
    for (_, operation) in document.operations.iter() {
        let counts = counter.selections(&operation.node.selection_set.node, 0)?;
        if counts.root > MAX_ROOT_FIELDS as u64 {
            return Err(LimitError::TooManyRootFields);
        }
        total = total.saturating_add(counts.expanded);
        if total > MAX_EXPANDED_SELECTIONS {
            return Err(LimitError::TooManySelections);
        }
    }
    // Fragments no operation uses are still validated by the server: count them too.
    for name in document.fragments.keys() {
        counter.fragment(name.as_str(), 0)?;
    }
    Ok(())
}

/// What one selection set amounts to once its fragments are expanded.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    /// Fields at the set's own level (through fragments, not into sub-selections).
    root: u64,
    /// Fields at every level.
    expanded: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) -> Result<(), LimitError> {
        self.root = self.root.saturating_add(other.root);
        self.expanded = self.expanded.saturating_add(other.expanded);
        if self.expanded > MAX_EXPANDED_SELECTIONS {
            return Err(LimitError::TooManySelections);
        }
        Ok(())
    }
}

struct ExpansionCounter<'a> {
    document: &'a ExecutableDocument,
    /// Counts of each fragment already expanded.
    memo: HashMap<&'a str, Counts>,
    /// Fragments being expanded right now, to refuse cycles.
    in_progress: Vec<&'a str>,
}

impl<'a> ExpansionCounter<'a> {
    fn selections(&mut self, set: &'a SelectionSet, depth: usize) -> Result<Counts, LimitError> {
        let mut counts = Counts::default();
        for selection in &set.items {
            let here = match &selection.node {
                Selection::Field(field) => {
                    let children = self.selections(&field.node.selection_set.node, depth)?;
                    Counts {
                        root: 1,
                        expanded: children.expanded.saturating_add(1),
                    }
                }
                Selection::FragmentSpread(spread) => {
                    self.fragment(spread.node.fragment_name.node.as_str(), depth + 1)?
                }
                Selection::InlineFragment(inline) => {
                    self.selections(&inline.node.selection_set.node, depth)?
                }
            };
            counts.add(here)?;
        }
        Ok(counts)
    }

    fn fragment(&mut self, name: &'a str, depth: usize) -> Result<Counts, LimitError> {
        if let Some(counts) = self.memo.get(name) {
            return Ok(*counts);
        }
        if depth > MAX_FRAGMENT_DEPTH || self.in_progress.contains(&name) {
            return Err(LimitError::FragmentsTooDeep);
        }
        // An unknown fragment is a validation error reported later; it expands to nothing.
        let Some((key, fragment)) = self.document.fragments.get_key_value(name) else {
            return Ok(Counts::default());
        };
        self.in_progress.push(key.as_str());
        let counts = self.selections(&fragment.node.selection_set.node, depth);
        self.in_progress.pop();
        let counts = counts?;
        self.memo.insert(key.as_str(), counts);
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> ExecutableDocument {
        async_graphql::parser::parse_query(query).expect("parses")
    }

    /// N fragments, each spreading the previous one twice: 2^N fields if expanded.
    fn fragment_bomb(n: usize) -> String {
        let mut text = format!("query {{ ...F{n} }}\nfragment F1 on Query {{ __typename }}\n");
        for i in 2..=n {
            text.push_str(&format!(
                "fragment F{i} on Query {{ ...F{p} ...F{p} }}\n",
                p = i - 1
            ));
        }
        text
    }

    #[test]
    fn exponential_spreads_are_counted_in_linear_time() {
        let started = std::time::Instant::now();
        assert_eq!(
            check_document(&parsed(&fragment_bomb(30))),
            Err(LimitError::TooManySelections)
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(check_document(&parsed(&fragment_bomb(5))), Ok(()));
    }

    #[test]
    fn fragment_cycles_and_wide_roots_are_refused() {
        let cycle = "query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }";
        assert_eq!(
            check_document(&parsed(cycle)),
            Err(LimitError::FragmentsTooDeep)
        );
        let wide = format!(
            "{{ {} }}",
            (0..=MAX_ROOT_FIELDS)
                .map(|i| format!("a{i}: __typename"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        assert_eq!(
            check_document(&parsed(&wide)),
            Err(LimitError::TooManyRootFields)
        );
    }
}
