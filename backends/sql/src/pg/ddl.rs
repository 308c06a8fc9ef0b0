//! The tables and functions: `ddl/postgres.sql`, the one source, made for
//! one schema and table prefix; and the functions a move from an older
//! layout creates, taken from it.

use super::{quote, Keys, Names};
use crate::ddl;
use crate::dialect::DbResult;
use crate::layout::DEFAULT_PREFIX;

/// The tables and functions, as `ddl/postgres.sql` keeps them: for schema
/// [`SCRIPT_SCHEMA`] and the default table prefix.
const SCRIPT: &str = include_str!("../../ddl/postgres.sql");

/// The schema the script is written for.
pub(super) const SCRIPT_SCHEMA: &str = "public";

impl Names {
    /// The tables and functions, as a script a DBA can run: the script of
    /// `ddl/postgres.sql` for these names.
    pub(super) fn ddl(&self) -> String {
        self.renamed(ddl::without_notes(SCRIPT))
    }

    /// The functions layout 5 added (the fence of layout 4 with them): what
    /// a session creates alone when it moves layout 3 or 4 tables to layout
    /// 5. Each is taken from the script with the comment lines right above
    /// its `CREATE`.
    pub(super) fn upgrade_ddl(&self) -> DbResult<String> {
        let functions = ["fence", "wait_turn", "release"]
            .iter()
            .map(|name| script_function(ddl::without_notes(SCRIPT), name))
            .collect::<DbResult<Vec<&str>>>()?;
        Ok(self.renamed(&functions.join("\n")))
    }

    /// `text` of the script with its names replaced by these.
    fn renamed(&self, text: &str) -> String {
        let script = Keys::new(SCRIPT_SCHEMA, DEFAULT_PREFIX);
        let keys = Keys::new(&self.schema, &self.prefix);
        let (script_salt, salt) = (script.salt.to_string(), keys.salt.to_string());
        let (script_class, class) = (script.class.to_string(), keys.class.to_string());
        ddl::rename(
            text,
            &[
                (&quote(SCRIPT_SCHEMA), &quote(&self.schema)),
                (&format!("\"{DEFAULT_PREFIX}"), &format!("\"{}", self.prefix)),
                (DEFAULT_PREFIX, &self.prefix),
                (&script_salt, &salt),
                (&script_class, &class),
                (&script.channel, &keys.channel),
            ],
        )
    }
}

/// The definition of function (or procedure) `name` in `script`, as a
/// session creates it alone: from the comment lines right above its
/// `CREATE` to its closing `$fn$;` line.
fn script_function<'s>(script: &'s str, name: &str) -> DbResult<&'s str> {
    let called = format!(" {}.\"{DEFAULT_PREFIX}{name}\"(", quote(SCRIPT_SCHEMA));
    let mut lines = Vec::new();
    let mut at = 0;
    for line in script.split_inclusive('\n') {
        lines.push((at, line));
        at += line.len();
    }
    let missing = || sqlx::Error::Configuration(format!("the DDL script has no function {name}").into());
    let create = lines
        .iter()
        .position(|(_, line)| line.starts_with("CREATE OR REPLACE ") && line.contains(&called))
        .ok_or_else(missing)?;
    let first = lines[..create]
        .iter()
        .rposition(|(_, line)| !line.starts_with("--"))
        .map_or(0, |before| before + 1);
    let (end, last) = lines[create..]
        .iter()
        .find(|(_, line)| line.trim_end() == "$fn$;")
        .ok_or_else(missing)?;
    Ok(&script[lines[first].0..end + last.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::LAYOUT_VERSION;

    #[test]
    fn the_script_is_of_this_layout() {
        let script = ddl::without_notes(SCRIPT);
        assert!(script.starts_with(&format!("-- lockline's tables and functions (layout {LAYOUT_VERSION})")));
        assert!(script.contains(&format!("(layout) VALUES ({LAYOUT_VERSION}) ON CONFLICT DO NOTHING;")));
    }

    #[test]
    fn every_name_of_the_script_is_replaced() {
        let (script, keys) = (Keys::new(SCRIPT_SCHEMA, DEFAULT_PREFIX), Keys::new("app", "p_"));
        let (salt, class) = (script.salt.to_string(), script.class.to_string());
        ddl::check_renaming(
            SCRIPT,
            &Names::new(SCRIPT_SCHEMA, DEFAULT_PREFIX).ddl(),
            &Names::new("app", "p_").ddl(),
            &["\"public\"", DEFAULT_PREFIX, &salt, &class, &script.channel],
            &[
                (&format!("\"{SCRIPT_SCHEMA}\".\"{DEFAULT_PREFIX}"), "\"app\".\"p_"),
                (&format!("# {salt}"), &format!("# {}", keys.salt)),
                (&format!("_lock({class}, "), &format!("_lock({}, ", keys.class)),
                (
                    &format!("pg_notify('{}' || ", script.channel),
                    &format!("pg_notify('{}' || ", keys.channel),
                ),
            ],
        );
    }

    #[test]
    fn the_functions_of_a_move_are_taken_whole() {
        let moved = Names::new("app", "p_").upgrade_ddl().expect("the functions");
        for function in ["fence", "wait_turn", "release"] {
            assert_eq!(
                moved.matches(&format!("\"app\".\"p_{function}\"(")).count(),
                1,
                "{moved}"
            );
        }
        assert_eq!(moved.matches("CREATE OR REPLACE").count(), 3, "{moved}");
        assert_eq!(moved.matches("$fn$;").count(), 3, "{moved}");
        assert!(moved.starts_with("-- The fence of a transaction"), "{moved}");
        assert!(moved.ends_with("$fn$;\n"), "{moved}");
    }
}
