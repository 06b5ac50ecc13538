//! Where a field error leaves its `null` (GraphQL spec 6.4.4, "Handling Field Errors"):
//! at the failed field if it is nullable, otherwise at its nearest nullable parent, or
//! the whole `data`. async-graphql instead leaves a failed field out of its object.
//! Once `data` is null, the mutations after the one that failed are not run. And where no
//! field failed, `data` is never null: one whose every root field was skipped is `{}`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextResolve, ResolveInfo,
};
use async_graphql::{QueryPathNode, QueryPathSegment, Response, ServerError, ServerResult, Value};

/// The schema extension that puts each field error's `null` where the spec says, for
/// every operation on every transport (each event of a subscription included).
pub struct FieldErrorNulls;

impl ExtensionFactory for FieldErrorNulls {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Nulls::default())
    }
}

/// One request's half of [`FieldErrorNulls`]: what failed and has not yet reached the
/// value that takes its `null`.
#[derive(Default)]
struct Nulls {
    /// Values that must become `null` because a non-null child failed, by path (leaf first).
    failed_parents: Mutex<Vec<Vec<Segment>>>,
    /// Whether a non-null root field failed: the whole `data` is `null`.
    root_failed: AtomicBool,
    /// Errors of nullable fields, which this extension answered with `null` itself.
    errors: Mutex<Vec<ServerError>>,
}

/// One step of a response path, owned.
#[derive(Debug, PartialEq, Eq)]
enum Segment {
    Index(usize),
    Name(String),
}

impl Nulls {
    /// Whether a non-null child of the value at `path` failed (forgetting it: that value
    /// takes the `null` now).
    fn child_failed(&self, path: &QueryPathNode<'_>) -> bool {
        let mut failed = lock(&self.failed_parents);
        if failed.is_empty() {
            return false;
        }
        let before = failed.len();
        failed.retain(|recorded| !same_path(recorded, path));
        failed.len() != before
    }

    /// Records that the value holding a failed non-null value at `path` must be `null`.
    fn fail_parent_of(&self, path: &QueryPathNode<'_>) {
        match path.parent {
            Some(parent) => lock(&self.failed_parents).push(owned_path(parent)),
            None => self.root_failed.store(true, Ordering::Relaxed),
        }
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for Nulls {
    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let mut response = next.run(ctx, operation_name).await;
        response.errors.append(&mut lock(&self.errors));
        if self.root_failed.swap(false, Ordering::Relaxed) {
            response.data = Value::Null;
        } else if response.data == Value::Null && response.errors.is_empty() {
            // Every root field was skipped: async-graphql answers an empty selection with
            // `null`, where the result is an empty object (and `data` with no errors is
            // never null).
            response.data = Value::Object(Default::default());
        }
        lock(&self.failed_parents).clear();
        response
    }

    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        let path = info.path_node;
        if path.parent.is_none()
            && info.parent_type == "Mutation"
            && self.root_failed.load(Ordering::Relaxed)
        {
            // `data` is null already: the mutations after the one that failed are not run,
            // as their results could not be told (what graphql-js does too).
            return Ok(Some(Value::Null));
        }
        let nullable = !info.return_type.ends_with('!');
        let result = next.run(ctx, info).await;
        // Checked whatever the result, so that what a failed child recorded is forgotten.
        let child_failed = self.child_failed(path);
        let error = match result {
            Ok(value) if !child_failed => return Ok(value),
            // The child's error is in the response already.
            Ok(_) => None,
            Err(error) => Some(error),
        };
        if nullable {
            lock(&self.errors).extend(error);
            return Ok(Some(Value::Null));
        }
        self.fail_parent_of(path);
        match error {
            // Reported by the object or list holding this value, which leaves it out.
            Some(error) => Err(error),
            None => Ok(Some(Value::Null)),
        }
    }
}

/// `path` as owned segments, leaf first.
fn owned_path(path: &QueryPathNode<'_>) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut node = Some(path);
    while let Some(current) = node {
        segments.push(match current.segment {
            QueryPathSegment::Index(index) => Segment::Index(index),
            QueryPathSegment::Name(name) => Segment::Name(name.to_owned()),
        });
        node = current.parent;
    }
    segments
}

/// Whether `recorded` (leaf first) is `path`.
fn same_path(recorded: &[Segment], path: &QueryPathNode<'_>) -> bool {
    let mut node = Some(path);
    for segment in recorded {
        let Some(current) = node else {
            return false;
        };
        let same = match (segment, &current.segment) {
            (Segment::Index(a), QueryPathSegment::Index(b)) => a == b,
            (Segment::Name(a), QueryPathSegment::Name(b)) => a == b,
            _ => false,
        };
        if !same {
            return false;
        }
        node = current.parent;
    }
    node.is_none()
}

/// The guard of `mutex`, poisoned or not (what it guards stays consistent either way).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
