//! DDL scripts as statements: `schema/schema.sql` and `schema/migrations.sql` are run one
//! statement at a time.

/// Splits a DDL script into statements: on `;` outside quotes, with `--` and `/* */` comments
/// removed.
pub fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                current.push(c);
                while let Some(d) = chars.next() {
                    current.push(d);
                    if d == '\\' && c != '`' {
                        if let Some(e) = chars.next() {
                            current.push(e);
                        }
                    } else if d == c {
                        if chars.peek() == Some(&c) {
                            current.push(chars.next().unwrap_or(c));
                        } else {
                            break;
                        }
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        current.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                current.push(' ');
            }
            ';' => {
                let stmt = current.trim();
                if !stmt.is_empty() {
                    out.push(stmt.to_owned());
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    let stmt = current.trim();
    if !stmt.is_empty() {
        out.push(stmt.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_respects_quotes_and_comments() {
        let sql = "-- a; comment\nCREATE TABLE a (x INT COMMENT 'semi; colon ''q''');\n/* b; */ SELECT \"x;\";";
        assert_eq!(
            statements(sql),
            vec![
                "CREATE TABLE a (x INT COMMENT 'semi; colon ''q''')".to_owned(),
                "SELECT \"x;\"".to_owned()
            ]
        );
    }
}
