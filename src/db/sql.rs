//! The one renderer of Courier's SQL templates. A template names what differs by backend
//! or by call with tokens, `{name}` or `{name(arg)}`, and whoever knows a token's meaning
//! expands it through [`render`]: the clock (`{now}`, `{after(X)}`, ...), the parking rule
//! (`{parked(X)}`, ...), or a caller filling a named slot with [`fill`]. [`Rows`] binds a
//! table of values the same way for every number of rows.

use sea_orm::sea_query::ArrayType;
use sea_orm::{DbBackend, DbErr, Value};

/// `template` with every token `{name}` or `{name(arg)}` for which `expand(name, arg)`
/// answers replaced by that answer. Other braces (a JSON path such as `'{t}'`, a token
/// meant for a later pass) are left as they are.
pub fn render(
    template: &str,
    mut expand: impl FnMut(&str, Option<&str>) -> Option<String>,
) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let token = &rest[open + 1..];
        let name_len = token
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(token.len());
        let name = &token[..name_len];
        let after_name = &token[name_len..];
        let (arg, end) = if let Some(tail) = after_name.strip_prefix('}') {
            (None, Some(tail))
        } else if let Some(inner) = after_name.strip_prefix('(') {
            match inner.find(")}") {
                Some(close) => (Some(&inner[..close]), Some(&inner[close + 2..])),
                None => (None, None),
            }
        } else {
            (None, None)
        };
        match end
            .filter(|_| !name.is_empty())
            .and_then(|end| Some((expand(name, arg)?, end)))
        {
            Some((expanded, end)) => {
                out.push_str(&expanded);
                rest = end;
            }
            None => {
                out.push('{');
                rest = token;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `template` with each named slot `{name}` in `slots` filled with its text.
pub fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    render(template, |name, arg| match arg {
        None => slots
            .iter()
            .find(|(slot, _)| *slot == name)
            .map(|(_, text)| (*text).to_owned()),
        Some(_) => None,
    })
}

/// `ids` as SQLite statements read a list of ids: one JSON array of their hex forms, bound
/// as one parameter and read back with `SELECT unhex(value) FROM json_each($n)`.
pub fn sqlite_ids<'a>(ids: impl IntoIterator<Item = &'a uuid::Uuid>) -> Value {
    let mut json = String::from("[");
    for (n, id) in ids.into_iter().enumerate() {
        if n > 0 {
            json.push(',');
        }
        json.push('"');
        json.push_str(id.simple().encode_lower(&mut uuid::Uuid::encode_buffer()));
        json.push('"');
    }
    json.push(']');
    Value::from(json)
}

/// Rows a statement reads as a table, `WITH v (a, b, ...) AS ({rows})`: on PostgreSQL one
/// array per column (`SELECT * FROM unnest($1::uuid[], $2::text[], ...)`), so the statement
/// text is the same for every number of rows and prepares once; on SQLite (which has no
/// arrays) a `VALUES` list. No value may be NULL (an array element cannot be bound as
/// one): a nullable column travels with a value that cannot occur, which the statement
/// turns back into NULL (`NULLIF`).
#[derive(Debug)]
pub struct Rows {
    backend: DbBackend,
    types: &'static [&'static str],
    /// Column by column.
    columns: Vec<Vec<Value>>,
}

impl Rows {
    /// An empty set of rows whose columns have these PostgreSQL `types` (`uuid`, `text`, ...).
    pub fn new(backend: DbBackend, types: &'static [&'static str]) -> Self {
        Rows {
            backend,
            types,
            columns: types.iter().map(|_| Vec::new()).collect(),
        }
    }

    /// Adds a row, one value per column, in column order. A row that does not fit is
    /// refused whole, leaving the set as it was.
    pub fn push(&mut self, row: impl IntoIterator<Item = Value>) -> Result<(), DbErr> {
        let row: Vec<Value> = row.into_iter().collect();
        if row.len() != self.types.len() {
            return Err(DbErr::Custom(format!(
                "a row of {} values for {} columns",
                row.len(),
                self.types.len()
            )));
        }
        for (n, (column, value)) in self.columns.iter().zip(&row).enumerate() {
            if !value.is_some() {
                return Err(DbErr::Custom(format!(
                    "a NULL in column {n} of a row set; nullable columns travel as a stand-in"
                )));
            }
            if column
                .first()
                .is_some_and(|first| first.array_type() != value.array_type())
            {
                return Err(DbErr::Custom(format!(
                    "mixed value types in column {n} of a row set"
                )));
            }
        }
        for (column, value) in self.columns.iter_mut().zip(row) {
            column.push(value);
        }
        Ok(())
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many rows there are.
    fn len(&self) -> usize {
        self.columns.first().map_or(0, Vec::len)
    }

    /// The SQL for the `{rows}` slot with parameters numbered from `first`, and the values
    /// to bind for them. With no rows (on PostgreSQL: to prepare a statement), each array
    /// is bound with its declared type, as rows would bind it.
    pub fn render(self, first: usize) -> (String, Vec<Value>) {
        match self.backend {
            DbBackend::Postgres => {
                let arrays = self
                    .types
                    .iter()
                    .enumerate()
                    .map(|(n, ty)| format!("${}::{ty}[]", first + n))
                    .collect::<Vec<_>>()
                    .join(", ");
                let values = self
                    .columns
                    .into_iter()
                    .zip(self.types)
                    .map(|(column, declared)| {
                        let ty = column
                            .first()
                            .map_or_else(|| array_type(declared), Value::array_type);
                        Value::Array(ty, Some(Box::new(column)))
                    })
                    .collect();
                (format!("SELECT * FROM unnest({arrays})"), values)
            }
            _ => {
                let width = self.types.len();
                let rows = self.len();
                let list = (0..rows)
                    .map(|row| {
                        let params = (0..width)
                            .map(|col| format!("${}", first + row * width + col))
                            .collect::<Vec<_>>()
                            .join(", ");
                        format!("({params})")
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut values = Vec::with_capacity(rows * width);
                let mut columns: Vec<_> = self.columns.into_iter().map(Vec::into_iter).collect();
                for _ in 0..rows {
                    for column in &mut columns {
                        values.extend(column.next());
                    }
                }
                (format!("VALUES {list}"), values)
            }
        }
    }
}

/// The array type sea-orm binds for a column of PostgreSQL type `declared` (what its
/// values would bind as), so an empty array is bound as the same type as a full one.
fn array_type(declared: &str) -> ArrayType {
    match declared {
        "uuid" => ArrayType::Uuid,
        "jsonb" | "json" => ArrayType::Json,
        "int2" | "smallint" => ArrayType::SmallInt,
        "int4" | "int" | "integer" => ArrayType::Int,
        "int8" | "bigint" => ArrayType::BigInt,
        "float8" | "double precision" => ArrayType::Double,
        "bool" | "boolean" => ArrayType::Bool,
        "timestamptz" => ArrayType::ChronoDateTimeUtc,
        _ => ArrayType::String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_expanded_by_whoever_knows_them() {
        let sql = render(
            "SELECT {now}, {after(v.delay)}, jsonb_set(x, '{t}', y), {other}",
            |name, arg| match (name, arg) {
                ("now", None) => Some("NOW".into()),
                ("after", Some(arg)) => Some(format!("AFTER[{arg}]")),
                _ => None,
            },
        );
        assert_eq!(
            sql,
            "SELECT NOW, AFTER[v.delay], jsonb_set(x, '{t}', y), {other}"
        );
    }

    #[test]
    fn sqlite_ids_are_one_json_array_of_hex() {
        let a = uuid::Uuid::from_u128(0xa);
        let b = uuid::Uuid::from_u128(0xb1);
        assert_eq!(
            sqlite_ids(&[a, b]),
            Value::from(
                r#"["0000000000000000000000000000000a","000000000000000000000000000000b1"]"#
            )
        );
        assert_eq!(sqlite_ids(&[]), Value::from("[]"));
    }

    #[test]
    fn slots_are_filled_by_name() {
        assert_eq!(
            fill(
                "WHERE id {ids} AND {x}.a = {x}.b {unknown}",
                &[("ids", "= ANY($1)"), ("x", "t")]
            ),
            "WHERE id = ANY($1) AND t.a = t.b {unknown}"
        );
        assert_eq!(fill("{ids(1)} {", &[("ids", "no")]), "{ids(1)} {");
    }

    #[test]
    fn rows_are_arrays_on_postgres_and_values_on_sqlite() {
        let build = |backend| {
            let mut rows = Rows::new(backend, &["uuid", "text"]);
            for n in 0..3 {
                rows.push([Value::from(uuid::Uuid::nil()), Value::from(format!("r{n}"))])
                    .unwrap();
            }
            rows
        };
        let (sql, values) = build(DbBackend::Postgres).render(2);
        assert_eq!(sql, "SELECT * FROM unnest($2::uuid[], $3::text[])");
        assert_eq!(
            values.len(),
            2,
            "one array per column, whatever the number of rows"
        );
        let (sql, values) = build(DbBackend::Sqlite).render(1);
        assert_eq!(sql, "VALUES ($1, $2), ($3, $4), ($5, $6)");
        assert_eq!(values[3], Value::from("r1".to_owned()));

        let mut rows = Rows::new(DbBackend::Postgres, &["text"]);
        assert!(
            rows.push([Value::String(None)]).is_err(),
            "NULL elements are refused"
        );
        assert!(rows.push([Value::from(1)]).is_ok());
        assert!(
            rows.push([Value::from("x")]).is_err(),
            "one type per column"
        );
        assert!(
            rows.push(Vec::<Value>::new()).is_err(),
            "one value per column"
        );
    }
}
