//! Bounds on a GraphQL document, checked before anything recurses on it or expands it:
//! size and nesting by a flat scan of the text, then fragment expansion and root fields
//! counted once per fragment ([`super::expansion`]). A hostile document costs a scan, never
//! a stack or a stall.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::runtime::RuntimeFlavor;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest, NextValidation,
};
use async_graphql::parser::types::{ExecutableDocument, Selection};
use async_graphql::{ErrorExtensionValues, Request, ServerError, ServerResult, ValidationResult};

use super::documents::{DocumentCache, KnownDocument, ParsedDocument};
use super::single_root::selected_operation;
use super::verdicts;

/// Deepest selection a query may make.
pub const MAX_QUERY_DEPTH: usize = 12;
/// Deepest selection an operation that only introspects may make. The standard
/// introspection query (graphql-js, which GraphiQL sends) nests type references 15 deep;
/// it reads only the schema, whose size is fixed, and the other limits still apply.
pub const MAX_INTROSPECTION_DEPTH: usize = 20;
/// The query budget: the largest total cost of one operation. Each field costs 1, and a
/// connection field costs its page size (`first`, default 20) times its selection.
pub const MAX_QUERY_COMPLEXITY: usize = 5_000;
/// Largest document (the query text) accepted, in bytes. Payloads belong in variables.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// Deepest nesting of `{`, `[` and `(` in a document: selections, list and object
/// literals and argument lists together.
pub const MAX_NESTING: usize = 64;
/// Most field selections a document may make once every fragment spread is expanded.
pub const MAX_EXPANDED_SELECTIONS: u64 = 5_000;
/// Most fields at the root of one operation (aliases included).
pub const MAX_ROOT_FIELDS: usize = 32;
/// Longest chain of fragments spreading fragments.
pub const MAX_FRAGMENT_DEPTH: usize = 32;
/// Documents larger than this are parsed and checked off the async runtime's threads.
pub(super) const PARSE_OFF_RUNTIME_BYTES: usize = 8 * 1024;

/// Why a document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The text is too long.
    #[error("the document is larger than {MAX_DOCUMENT_BYTES} bytes; send payloads as variables")]
    TooLarge,
    /// Brackets, braces or parentheses nest too deeply.
    #[error("the document nests deeper than {MAX_NESTING} levels")]
    TooDeep,
    /// Fragment spreads expand to too many selections.
    #[error("the document selects more than {MAX_EXPANDED_SELECTIONS} fields once fragments are expanded")]
    TooManySelections,
    /// Too many fields at the root of one operation.
    #[error("an operation may select at most {MAX_ROOT_FIELDS} root fields")]
    TooManyRootFields,
    /// Fragments spread each other too deeply, or in a cycle.
    #[error(
        "fragments spread each other more than {MAX_FRAGMENT_DEPTH} levels deep, or in a cycle"
    )]
    FragmentsTooDeep,
    /// Selections nest too deeply.
    #[error("the query nests {0} selections deep; at most {1} are allowed")]
    SelectionsTooDeep(usize, usize),
    /// The query costs more than the budget.
    #[error("the query costs {0}, over the budget of {MAX_QUERY_COMPLEXITY} (a connection costs `first` times its selection)")]
    OverBudget(usize),
}

impl LimitError {
    /// The GraphQL error a refused document answers with.
    /// It carries `extensions.limit` so transports can tell it from other refusals.
    pub fn to_server_error(&self) -> ServerError {
        let mut error = ServerError::new(self.to_string(), None);
        let mut extensions = ErrorExtensionValues::default();
        extensions.set("code", "BAD_USER_INPUT");
        extensions.set("limit", self.kind());
        error.extensions = Some(extensions);
        error
    }

    /// A stable name for the limit, sent as `extensions.limit`.
    pub fn kind(&self) -> &'static str {
        match self {
            LimitError::TooLarge => "DOCUMENT_SIZE",
            LimitError::TooDeep => "NESTING",
            LimitError::TooManySelections => "EXPANDED_SELECTIONS",
            LimitError::TooManyRootFields => "ROOT_FIELDS",
            LimitError::FragmentsTooDeep => "FRAGMENT_DEPTH",
            LimitError::SelectionsTooDeep(..) => "DEPTH",
            LimitError::OverBudget(_) => "COST",
        }
    }
}

/// Whether `error` refused a document for one of these limits.
pub fn is_limit_refusal(error: &ServerError) -> bool {
    error
        .extensions
        .as_ref()
        .is_some_and(|extensions| extensions.get("limit").is_some())
}

/// Checks the text's size and nesting without parsing it: one pass over the bytes, with
/// strings, block strings and comments skipped, so nothing can recurse on hostile input.
pub fn scan_text(query: &str) -> Result<(), LimitError> {
    if query.len() > MAX_DOCUMENT_BYTES {
        return Err(LimitError::TooLarge);
    }
    let bytes = query.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                    i += 1;
                }
            }
            b'"' if bytes[i..].starts_with(b"\"\"\"") => {
                i += 3;
                while i < bytes.len() && !bytes[i..].starts_with(b"\"\"\"") {
                    // `\"""` inside a block string is an escaped delimiter.
                    i += if bytes[i..].starts_with(b"\\\"\"\"") {
                        4
                    } else {
                        1
                    };
                }
                i += 2;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(LimitError::TooDeep);
                }
            }
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Checks a request's document: the text scan, then parsing (cached on the request for
/// the executor) and the expansion count. Whether the document may be kept for next time:
/// not one whose text alone is refused (see [`super::input_literals`]).
fn check_request(request: &mut Request) -> ServerResult<Keep> {
    scan_text(&request.query).map_err(|err| err.to_server_error())?;
    let operation_name = request.operation_name.clone();
    let document = request.parsed_query()?;
    super::expansion::check_document(document).map_err(|err| err.to_server_error())?;
    let introspects = only_introspects(document, operation_name.as_deref());
    let refusal = super::single_root::refusal(document, operation_name.as_deref());
    if introspects {
        request.data.insert(IntrospectionOnly);
    }
    if let Some(refusal) = refusal {
        request.data.insert(Refused(refusal));
    }
    if let Some(repeated) = super::input_literals::repeated_field(&request.query) {
        request.data.insert(Refused(repeated));
        return Ok(Keep::No);
    }
    Ok(Keep::Yes)
}

/// Whether a checked document may be kept for its next request.
enum Keep {
    Yes,
    No,
}

/// [`check_request`] for a document `documents` may know: one that parsed and passed the
/// checks before is handed to the executor as it was parsed then; one that passes now is
/// kept for next time. The checks depend on the text alone. Returns the document as kept.
fn check_request_known(
    request: &mut Request,
    documents: &DocumentCache,
) -> ServerResult<Option<Arc<KnownDocument>>> {
    if let Some(known) = documents.get(&request.query) {
        let document = &known.document;
        if only_introspects(document, request.operation_name.as_deref()) {
            request.data.insert(IntrospectionOnly);
        }
        if let Some(refusal) =
            super::single_root::refusal(document, request.operation_name.as_deref())
        {
            request.data.insert(Refused(refusal));
        }
        request.set_parsed_query(ExecutableDocument::clone(document));
        request.data.insert(ParsedDocument(document.clone()));
        return Ok(Some(known));
    }
    if let Keep::Yes = check_request(request)? {
        let query = request.query.clone();
        if let Some(kept) = documents.insert(&query, request.parsed_query()?) {
            request.data.insert(ParsedDocument(kept.document.clone()));
            return Ok(Some(kept));
        }
    }
    Ok(None)
}

/// Marks a request whose operation only introspects (see [`MAX_INTROSPECTION_DEPTH`]).
struct IntrospectionOnly;

/// A validation error found with the document's checks, reported once async-graphql's own
/// validation passed (see [`super::single_root`]).
struct Refused(ServerError);

/// Whether the operation that would run selects nothing but `__schema`, `__type` and
/// `__typename` at its root, as fields (a fragment there counts as something else).
fn only_introspects(document: &ExecutableDocument, operation_name: Option<&str>) -> bool {
    let Some((_, operation)) = selected_operation(document, operation_name) else {
        return false;
    };
    let root = &operation.node.selection_set.node.items;
    !root.is_empty()
        && root.iter().all(|selection| match &selection.node {
            Selection::Field(field) => matches!(
                field.node.name.node.as_str(),
                "__schema" | "__type" | "__typename"
            ),
            _ => false,
        })
}

/// The schema extension that applies these limits to every request on every transport
/// (HTTP POST and GET, both WebSocket protocols) before the server parses or validates it,
/// with the process's parsed documents (see [`DocumentCache`]).
#[derive(Default)]
pub struct DocumentLimits {
    documents: Arc<DocumentCache>,
}

impl DocumentLimits {
    /// The limits, with the parsed documents kept in `documents`.
    pub fn new(documents: Arc<DocumentCache>) -> Self {
        Self { documents }
    }
}

impl ExtensionFactory for DocumentLimits {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(DocumentLimitsExtension {
            large: AtomicBool::new(false),
            documents: self.documents.clone(),
        })
    }
}

/// One request's half of [`DocumentLimits`].
struct DocumentLimitsExtension {
    /// Whether the document is large enough to be parsed and validated off the runtime.
    large: AtomicBool,
    /// The documents parsed before.
    documents: Arc<DocumentCache>,
}

#[async_graphql::async_trait::async_trait]
impl Extension for DocumentLimitsExtension {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        let large = request.query.len() > PARSE_OFF_RUNTIME_BYTES;
        self.large.store(large, Ordering::Relaxed);
        let mut known = None;
        if large {
            // Parsing a large document takes milliseconds: not on the threads serving everyone.
            let checked = tokio::task::spawn_blocking(move || {
                let result = check_request(&mut request);
                result.map(|_| request)
            })
            .await
            .map_err(|err| {
                ServerError::new(format!("checking the document failed: {err}"), None)
            })?;
            request = checked?;
        } else {
            known = check_request_known(&mut request, &self.documents)?;
        }
        let registry = &ctx.schema_env.registry;
        if let Some(root_type) = registry.subscription_type.as_deref() {
            let operation_name = request.operation_name.clone();
            let document = request.parsed_query()?;
            if let Some(inlined) = super::single_root::root_fields_inlined(
                document,
                operation_name.as_deref(),
                root_type,
            ) {
                request.set_parsed_query(inlined);
                // What runs is no longer the document as kept.
                known = None;
            }
        }
        super::variables::check_required(&mut request)?;
        super::coercion::check_arguments(registry, &mut request)?;
        verdicts::prepare(registry, known, &mut request)?;
        next.run(ctx, request).await
    }

    /// The depth limit and the query budget, applied to what validation measured.
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        // Validation of a large document (within the limits) can take milliseconds: let
        // the runtime move other tasks off this thread meanwhile, where it can.
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|handle| handle.runtime_flavor() == RuntimeFlavor::MultiThread);
        let measured = verdicts::validate(ctx, async move {
            match runtime {
                Some(runtime) if self.large.load(Ordering::Relaxed) => {
                    tokio::task::block_in_place(|| runtime.block_on(next.run(ctx)))
                }
                _ => next.run(ctx).await,
            }
        })
        .await?;
        if let Some(Refused(refusal)) = ctx.data_opt::<Refused>() {
            return Err(vec![refusal.clone()]);
        }
        let max_depth = if ctx.data_opt::<IntrospectionOnly>().is_some() {
            MAX_INTROSPECTION_DEPTH
        } else {
            MAX_QUERY_DEPTH
        };
        if measured.depth > max_depth {
            return Err(vec![LimitError::SelectionsTooDeep(
                measured.depth,
                max_depth,
            )
            .to_server_error()]);
        }
        if measured.complexity > MAX_QUERY_COMPLEXITY {
            return Err(vec![
                LimitError::OverBudget(measured.complexity).to_server_error()
            ]);
        }
        Ok(measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_is_refused_without_parsing() {
        let deep = format!(
            "{{ endpoints(first: {}1{}) {{ edges {{ cursor }} }} }}",
            "[".repeat(5_000),
            "]".repeat(5_000)
        );
        assert_eq!(scan_text(&deep), Err(LimitError::TooDeep));
        let fine = format!("{{ a(x: {}1{}) }}", "[".repeat(20), "]".repeat(20));
        assert_eq!(scan_text(&fine), Ok(()));
    }

    #[test]
    fn brackets_inside_strings_and_comments_do_not_count() {
        let text = format!(
            "# {}\n{{ a(x: \"{}\", y: \"\"\"{}\\\"\"\"{}\"\"\") }}",
            "[".repeat(500),
            "{".repeat(500),
            "(".repeat(500),
            "[".repeat(500)
        );
        assert_eq!(scan_text(&text), Ok(()));
        assert_eq!(
            scan_text(&"x".repeat(MAX_DOCUMENT_BYTES + 1)),
            Err(LimitError::TooLarge)
        );
    }
}
