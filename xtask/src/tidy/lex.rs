//! A light Rust lexer for the architecture checks: the identifiers and
//! punctuation of a source file with their line numbers, comments and
//! string, char and byte literals left out (a literal is one `"` token, so
//! the tokens on either side stay apart). Enough to see names and paths;
//! it knows nothing of macros (a macro's input is tokens like any other).

/// One token: an identifier (or keyword, or number) or one punctuation mark,
/// `::` being one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) line: usize,
    pub(super) text: String,
}

impl Token {
    pub(super) fn is_ident(&self) -> bool {
        self.text
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    }
}

/// The tokens of `source`.
pub(super) fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let push = |out: &mut Vec<Token>, line, text: String| out.push(Token { line, text });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_whitespace() => i += 1,
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    match (chars[i], chars.get(i + 1)) {
                        ('/', Some('*')) => {
                            depth += 1;
                            i += 2;
                        }
                        ('*', Some('/')) => {
                            depth -= 1;
                            i += 2;
                            if depth == 0 {
                                break;
                            }
                        }
                        ('\n', _) => {
                            line += 1;
                            i += 1;
                        }
                        _ => i += 1,
                    }
                }
            }
            '"' => {
                let start = line;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    match chars[i] {
                        '\\' => i += 2,
                        '\n' => {
                            line += 1;
                            i += 1;
                        }
                        _ => i += 1,
                    }
                }
                i += 1;
                push(&mut out, start, "\"".to_owned());
            }
            '\'' => {
                // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
                if next == Some('\\') {
                    // Past the quote, the backslash and the escaped char ('\'').
                    i += 3;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                    push(&mut out, line, "\"".to_owned());
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                    push(&mut out, line, "\"".to_owned());
                } else {
                    i += 1;
                    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                }
            }
            _ if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // A raw string (r"..", r#".."#, br".."): skip to its end.
                let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                if matches!(word.as_str(), "r" | "br" | "cr") && chars.get(i + hashes) == Some(&'"')
                {
                    let start = line;
                    let end: String = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', hashes))
                        .collect();
                    i += hashes + 1;
                    while i < chars.len()
                        && !chars[i..].starts_with(&end.chars().collect::<Vec<_>>()[..])
                    {
                        if chars[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                    i += end.len();
                    push(&mut out, start, "\"".to_owned());
                } else if matches!(word.as_str(), "b" | "c") && chars.get(i) == Some(&'"') {
                    // b"..": the string itself is the next token.
                } else if word == "b" && chars.get(i) == Some(&'\'') {
                    // b'x': the char literal is the next token.
                } else {
                    push(&mut out, line, word);
                }
            }
            ':' if next == Some(':') => {
                push(&mut out, line, "::".to_owned());
                i += 2;
            }
            _ => {
                push(&mut out, line, c.to_string());
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(source: &str) -> Vec<String> {
        tokens(source).into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn comments_and_literals_are_left_out() {
        let source = "use crate::a::{b, c}; // helm\n/* Release /* nested */ */ \
                      let s = \"Helm {\"; let r = r#\"chart\"#; let c = '{'; fn f<'a>() {}\n\
                      let b = b\"manifest\"; let x = b'}';\n\
                      let q = '\\''; let e = '\\u{7B}'; let helm = 1;";
        let got = texts(source);
        for word in ["Release", "nested", "Helm", "chart", "manifest"] {
            assert!(!got.iter().any(|t| t == word), "{word} in {got:?}");
        }
        assert_eq!(
            got[..11],
            [
                "use", "crate", "::", "a", "::", "{", "b", ",", "c", "}", ";"
            ]
        );
        let braces = |open: &str| got.iter().filter(|t| *t == open).count();
        assert_eq!(braces("{"), braces("}"), "{got:?}");
        assert!(got.iter().any(|t| t == "a") && got.iter().any(|t| t == "f"));
        assert_eq!(
            got.iter().filter(|t| *t == "helm").count(),
            1,
            "code after the chars"
        );
    }

    #[test]
    fn lines_are_counted_through_comments_and_strings() {
        let found = tokens("/*\n*/\n\"a\nb\"\nx");
        assert_eq!(
            found.last().map(|t| (t.line, t.text.as_str())),
            Some((5, "x"))
        );
    }
}
