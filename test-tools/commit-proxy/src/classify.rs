//! Statement classification: is this query a COMMIT, a ROLLBACK, a BEGIN, or something else?
//!
//! A small lexer, not an SQL parser. It skips whitespace and comments (`/* */`, `#`, and `-- `
//! when the dashes are followed by whitespace, as MySQL requires), reads executable comments
//! (`/*!…*/`, `/*!50000 …*/`, `/*M!100000 …*/`) as the code the server would run, steps over
//! quoted strings and identifiers, and splits multi-statement queries at top-level `;`. Then
//! each statement's words are matched against the exact grammar of COMMIT, ROLLBACK, BEGIN and
//! START TRANSACTION. Anything else is `Other`, so look-alikes (`SELECT 'COMMIT'`, `COMMITTED`,
//! a table named `commit_log`, `/* COMMIT */ SELECT 1`, `RELEASE SAVEPOINT x`) never match.
//!
//! A version-gated executable comment runs only on servers new enough, and MariaDB's rule for
//! five-digit versions is not the obvious one; a statement seen only inside one is marked
//! `certain = false`, and the proxy confirms it from the server's reply (the in-transaction
//! flag going from 1 to 0) before acting on it.

/// What a statement does to the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Commit,
    Rollback,
    Begin,
    Other,
}

impl Kind {
    /// The lowercase name used in rules and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Commit => "commit",
            Kind::Rollback => "rollback",
            Kind::Begin => "begin",
            Kind::Other => "other",
        }
    }
}

/// One classified statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    pub kind: Kind,
    /// `AND CHAIN`: a new transaction starts at once (the reply keeps the in-transaction flag).
    pub chain: bool,
    /// `RELEASE`: the server closes the connection after replying.
    pub release: bool,
    /// False when the statement was seen only inside a version-gated executable comment.
    pub certain: bool,
}

impl Statement {
    fn other() -> Statement {
        Statement {
            kind: Kind::Other,
            chain: false,
            release: false,
            certain: true,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted,
    Punct(char),
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$' || !c.is_ascii()
}

/// Splits `sql` into statements of tokens; each statement also says whether any of its tokens
/// came from a version-gated executable comment. `None` when the text cannot be lexed (an
/// unterminated string or comment): the caller must not guess.
fn lex(sql: &str, backslash_escapes: bool) -> Option<Vec<(Vec<Token>, bool)>> {
    let chars: Vec<char> = sql.chars().collect();
    let mut statements = vec![(Vec::new(), false)];
    let mut i = 0;
    let mut in_exec = false;
    let mut gated = false;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let current = statements.last_mut().expect("one statement at least");
        match c {
            c if c.is_whitespace() => i += 1,
            '*' if in_exec && next == Some('/') => {
                in_exec = false;
                gated = false;
                i += 2;
            }
            '/' if next == Some('*') => {
                let exec = match (chars.get(i + 2), chars.get(i + 3)) {
                    (Some('!'), _) => Some(3),
                    (Some('M'), Some('!')) => Some(4),
                    _ => None,
                };
                match exec {
                    Some(skip) if !in_exec => {
                        i += skip;
                        let digits = chars[i..].iter().take_while(|c| c.is_ascii_digit()).count();
                        i += digits;
                        in_exec = true;
                        gated = digits > 0 || skip == 4;
                    }
                    _ => {
                        // A plain comment: skip to its end.
                        let end = (i + 2..chars.len().saturating_sub(1))
                            .find(|&j| chars[j] == '*' && chars[j + 1] == '/')?;
                        i = end + 2;
                    }
                }
            }
            '-' if next == Some('-')
                && chars
                    .get(i + 2)
                    .is_none_or(|c| c.is_whitespace() || c.is_control()) =>
            {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\'' | '"' | '`' => {
                let quote = c;
                i += 1;
                loop {
                    let d = *chars.get(i)?;
                    if d == '\\' && quote != '`' && backslash_escapes {
                        i += 2;
                    } else if d == quote {
                        if chars.get(i + 1) == Some(&quote) {
                            i += 2;
                        } else {
                            i += 1;
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                current.0.push(Token::Quoted);
                current.1 |= gated;
            }
            ';' => {
                statements.push((Vec::new(), false));
                i += 1;
            }
            c if is_ident(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                current.0.push(Token::Word(word.to_ascii_uppercase()));
                current.1 |= gated;
            }
            other => {
                current.0.push(Token::Punct(other));
                current.1 |= gated;
                i += 1;
            }
        }
    }
    if in_exec {
        return None;
    }
    statements.retain(|(tokens, _)| !tokens.is_empty());
    Some(statements)
}

/// Matches `[WORK] [AND [NO] CHAIN] [[NO] RELEASE]` exactly; returns (chain, release).
fn completion_tail(words: &[&str]) -> Option<(bool, bool)> {
    let mut rest = words;
    if rest.first() == Some(&"WORK") {
        rest = &rest[1..];
    }
    let mut chain = false;
    match rest {
        ["AND", "NO", "CHAIN", tail @ ..] => rest = tail,
        ["AND", "CHAIN", tail @ ..] => {
            chain = true;
            rest = tail;
        }
        _ => {}
    }
    let release = match rest {
        [] => false,
        ["RELEASE"] => true,
        ["NO", "RELEASE"] => false,
        _ => return None,
    };
    Some((chain, release))
}

fn classify_tokens(tokens: &[Token]) -> Statement {
    // Any quoted text or punctuation means this is not a bare transaction statement (the
    // only punctuation START TRANSACTION allows is a comma between modes).
    let mut words = Vec::with_capacity(tokens.len());
    for t in tokens {
        match t {
            Token::Word(w) => words.push(w.as_str()),
            Token::Punct(',') => words.push(","),
            _ => return Statement::other(),
        }
    }
    let with = |kind, (chain, release)| Statement {
        kind,
        chain,
        release,
        certain: true,
    };
    match words.as_slice() {
        ["COMMIT", tail @ ..] => completion_tail(tail)
            .map(|t| with(Kind::Commit, t))
            .unwrap_or_else(Statement::other),
        ["ROLLBACK", tail @ ..] => completion_tail(tail)
            .map(|t| with(Kind::Rollback, t))
            .unwrap_or_else(Statement::other),
        ["BEGIN"] | ["BEGIN", "WORK"] => with(Kind::Begin, (false, false)),
        ["START", "TRANSACTION", modes @ ..]
            if modes.iter().all(|w| {
                matches!(
                    *w,
                    "READ" | "ONLY" | "WRITE" | "WITH" | "CONSISTENT" | "SNAPSHOT" | ","
                )
            }) =>
        {
            with(Kind::Begin, (false, false))
        }
        _ => Statement::other(),
    }
}

/// Classifies every statement of a query text. An empty or comment-only query has none; a
/// text that cannot be lexed is one `Other`.
pub fn classify(sql: &str, backslash_escapes: bool) -> Vec<Statement> {
    match lex(sql, backslash_escapes) {
        None => vec![Statement::other()],
        Some(statements) => statements
            .iter()
            .map(|(tokens, gated)| {
                let mut s = classify_tokens(tokens);
                s.certain = !gated;
                s
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(sql: &str) -> Statement {
        let all = classify(sql, true);
        assert_eq!(all.len(), 1, "{sql:?} gave {all:?}");
        all[0]
    }

    #[test]
    fn commit_in_every_form() {
        for sql in [
            "COMMIT",
            "commit;",
            "commit work ;  ",
            "COMMIT WORK",
            "  \n\tCoMmIt  WORK  AND NO CHAIN NO RELEASE",
            "COMMIT AND NO CHAIN",
            "/* hi */ COMMIT -- trailing\n",
            "# c\nCOMMIT",
            "COMMIT--\n",
            "/*!COMMIT*/",
            "/*!COMMIT */;",
            "COMMIT /* after */ ;",
        ] {
            let s = one(sql);
            assert_eq!(s.kind, Kind::Commit, "{sql:?}");
            assert!(s.certain, "{sql:?}");
        }
        let chain = one("COMMIT AND CHAIN");
        assert!(chain.chain && !chain.release);
        let release = one("COMMIT WORK RELEASE");
        assert!(release.release && !release.chain);
    }

    #[test]
    fn version_gated_commits_are_uncertain() {
        for sql in [
            "/*!50000 COMMIT */",
            "/*!99999 COMMIT */",
            "/*M!100000 COMMIT */",
        ] {
            let s = one(sql);
            assert_eq!(s.kind, Kind::Commit, "{sql:?}");
            assert!(!s.certain, "{sql:?}");
        }
    }

    #[test]
    fn look_alikes_never_match() {
        for sql in [
            "SELECT 'COMMIT'",
            "SELECT \"COMMIT\"",
            "COMMITTED",
            "COMMIT_LOG",
            "SELECT * FROM commit_log",
            "INSERT INTO `commit` VALUES (1)",
            "/* COMMIT */ SELECT 1",
            "-- COMMIT\nSELECT 1",
            "RELEASE SAVEPOINT _sqlx_savepoint_1",
            "COMMIT WORK WORK",
            "COMMIT AND",
            "COMMIT 'x'",
            "XA COMMIT 'x'",
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "ROLLBACK TO SAVEPOINT s1",
            "ROLLBACK WORK TO s1",
            "BEGIN NOT ATOMIC SELECT 1; END",
            "SELECT 1 --COMMIT",
        ] {
            let all = classify(sql, true);
            assert!(
                all.iter().all(|s| s.kind == Kind::Other),
                "{sql:?} gave {all:?}"
            );
        }
        // `--COMMIT` without a space is not a comment in MySQL: it is `- -COMMIT`, still not a
        // bare COMMIT.
        assert_eq!(one("--COMMIT").kind, Kind::Other);
    }

    #[test]
    fn rollback_and_begin() {
        assert_eq!(one("ROLLBACK").kind, Kind::Rollback);
        assert_eq!(one("rollback work and no chain").kind, Kind::Rollback);
        assert_eq!(one("/*!ROLLBACK*/").kind, Kind::Rollback);
        for sql in [
            "BEGIN",
            "begin work",
            "START TRANSACTION",
            "START TRANSACTION READ ONLY",
            "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ WRITE",
        ] {
            assert_eq!(one(sql).kind, Kind::Begin, "{sql:?}");
        }
    }

    #[test]
    fn multi_statement_queries() {
        let all = classify("INSERT INTO t VALUES (';'); COMMIT;", true);
        assert_eq!(
            all.iter().map(|s| s.kind).collect::<Vec<_>>(),
            vec![Kind::Other, Kind::Commit]
        );
        let all = classify("BEGIN; INSERT INTO t VALUES ('a\\';b'); COMMIT", true);
        assert_eq!(
            all.iter().map(|s| s.kind).collect::<Vec<_>>(),
            vec![Kind::Begin, Kind::Other, Kind::Commit]
        );
        // With NO_BACKSLASH_ESCAPES the backslash is literal and the quote ends the string.
        let all = classify("SELECT 'a\\'; COMMIT", false);
        assert_eq!(all.last().map(|s| s.kind), Some(Kind::Commit));
        assert!(classify("/* only a comment */", true).is_empty());
        assert!(classify(";;", true).is_empty());
        // Unlexable text is never taken for a COMMIT.
        assert_eq!(
            classify("COMMIT /* unterminated", true)[0].kind,
            Kind::Other
        );
        assert_eq!(classify("SELECT 'open; COMMIT", true)[0].kind, Kind::Other);
    }
}
