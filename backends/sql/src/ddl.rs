//! What both dialects do with their DDL scripts (`ddl/postgres.sql`,
//! `ddl/mariadb.sql`), the one source of lockline's tables, functions and
//! procedures: each is written for the default names, runs as it is in its
//! engine's client, and is made for other names by replacing those.

/// What the lines of notes at the start of a script begin with: they are
/// for its readers, and left out of what lockline runs and prints.
const NOTE: &str = "-- |";

/// `script` without the lines of notes it starts with.
pub(crate) fn without_notes(script: &str) -> &str {
    let mut rest = script;
    while rest.starts_with(NOTE) {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    rest
}

/// `text` with each name of `names` (as the script writes it, left)
/// replaced by its value (right), in one pass: a value put in is never
/// looked at again, and the first name that matches at a place wins. A name
/// that ends with a digit is replaced only where no digit follows it, and
/// one that begins with a digit only where none comes before it, so that
/// a number is never replaced inside a longer one.
pub(crate) fn rename(text: &str, names: &[(&str, &str)]) -> String {
    let mut renamed = String::with_capacity(text.len() + text.len() / 8);
    let mut at = 0;
    let mut copied = 0;
    while at < text.len() {
        let rest = &text[at..];
        let digit_before = text[..at].ends_with(|c: char| c.is_ascii_digit());
        let found = names
            .iter()
            .find(|(name, _)| starts_with_whole(rest, name, digit_before));
        match found {
            Some((name, value)) => {
                renamed.push_str(&text[copied..at]);
                renamed.push_str(value);
                at += name.len();
                copied = at;
            }
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    renamed.push_str(&text[copied..]);
    renamed
}

/// Whether `rest` starts with `name`, not cut out of a longer number.
fn starts_with_whole(rest: &str, name: &str, digit_before: bool) -> bool {
    let digit = |c: char| c.is_ascii_digit();
    if name.is_empty() || !rest.starts_with(name) {
        return false;
    }
    let cut_before = name.starts_with(digit) && digit_before;
    let cut_after = name.ends_with(digit) && rest[name.len()..].starts_with(digit);
    !cut_before && !cut_after
}

/// Checks a dialect's renaming of its script, for its tests: `default`
/// (the script made for the names it is written for) is the script less
/// its notes; `other` (made for other names) has no name of `gone` left,
/// and each name of `renamed` (as the script writes it, left) is in the
/// script, and its value (right) as often in `other`.
#[cfg(test)]
pub(crate) fn check_renaming(script: &str, default: &str, other: &str, gone: &[&str], renamed: &[(&str, &str)]) {
    let source = without_notes(script);
    assert_eq!(default, source, "the script made for its own names is not the script");
    for name in gone {
        assert!(
            !other.contains(name),
            "{name} is left in the script made for other names"
        );
    }
    for (name, value) in renamed {
        assert!(source.contains(name), "the script has no {name}");
        assert_eq!(
            other.matches(value).count(),
            source.matches(name).count(),
            "{name} was not replaced by {value} wherever the script has it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_left_out() {
        assert_eq!(without_notes("-- | a\n-- |\n-- b\n-- | c\n"), "-- b\n-- | c\n");
        assert_eq!(without_notes("-- | only"), "");
        assert_eq!(without_notes("SELECT 1;\n"), "SELECT 1;\n");
    }

    #[test]
    fn names_are_replaced_once_and_whole() {
        let names = [("\"public\"", "\"lockline_\""), ("\"lockline_", "\"p_"), ("42", "7")];
        assert_eq!(
            rename("\"public\".\"lockline_x\" 42 142 420 (42)", &names),
            "\"lockline_\".\"p_x\" 7 142 420 (7)"
        );
        assert_eq!(rename("é42é", &names), "é7é");
        assert_eq!(rename("", &names), "");
    }
}
