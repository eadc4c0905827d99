//! The lexer of the IR text: words, `%names`, numbers, strings and punctuation, with positions.

use crate::error::IrError;

/// A token kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    /// A bare word: keyword, key, enum value, or number text (parsed by the consumer).
    Word(String),
    /// `%name`.
    Name(String),
    /// A double-quoted string, unescaped.
    Str(String),
    Equals,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    /// `..` in a range.
    DotDot,
    /// End of a line (statements are one per line).
    Newline,
    Eof,
}

impl Token {
    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            Token::Word(w) => crate::quote(w),
            Token::Name(n) => format!("'%{}'", crate::clip(n)),
            Token::Str(s) => format!("string \"{}\"", crate::clip(s)),
            Token::Equals => "'='".into(),
            Token::LBrace => "'{'".into(),
            Token::RBrace => "'}'".into(),
            Token::LBracket => "'['".into(),
            Token::RBracket => "']'".into(),
            Token::Comma => "','".into(),
            Token::DotDot => "'..'".into(),
            Token::Newline => "end of line".into(),
            Token::Eof => "end of input".into(),
        }
    }
}

/// A token and where it starts (1-based line and column).
#[derive(Debug, Clone)]
pub struct Spanned {
    pub token: Token,
    pub line: usize,
    pub column: usize,
}

/// Splits `text` into tokens; `source_name` names it in errors.
pub fn lex(text: &str, source_name: &str) -> Result<Vec<Spanned>, IrError> {
    let mut tokens = Vec::new();
    // A byte-order mark an editor put first is not part of the text.
    let chars: Vec<char> = text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .chars()
        .collect();
    let (mut i, mut line, mut line_start) = (0usize, 1usize, 0usize);
    let error = |line: usize, column: usize, message: String| IrError::Parse {
        source_name: source_name.to_string(),
        line,
        column,
        message,
    };
    while i < chars.len() {
        let c = chars[i];
        let column = i - line_start + 1;
        let mut push = |token: Token| {
            tokens.push(Spanned {
                token,
                line,
                column,
            })
        };
        match c {
            '\n' => {
                push(Token::Newline);
                i += 1;
                line += 1;
                line_start = i;
            }
            c if c.is_whitespace() => i += 1,
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '.' if chars.get(i + 1) == Some(&'.') => {
                push(Token::DotDot);
                i += 2;
            }
            '=' | '{' | '}' | '[' | ']' | ',' => {
                push(punctuation(c));
                i += 1;
            }
            '"' => {
                let mut value = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None | Some('\n') => {
                            return Err(error(line, column, "unterminated string".into()))
                        }
                        Some('"') => break,
                        Some('\\') => {
                            match chars.get(i + 1) {
                                Some('n') => value.push('\n'),
                                Some(&escaped @ ('"' | '\\')) => value.push(escaped),
                                _ => {
                                    return Err(error(
                                        line,
                                        i - line_start + 1,
                                        "unknown escape (valid: \\\", \\\\, \\n)".into(),
                                    ))
                                }
                            }
                            i += 2;
                        }
                        Some(&other) => {
                            value.push(other);
                            i += 1;
                        }
                    }
                }
                i += 1;
                push(Token::Str(value));
            }
            '%' => {
                let start = i + 1;
                i = scan_word(&chars, start, true);
                if i == start {
                    return Err(error(line, column, "expected a name after '%'".into()));
                }
                push(Token::Name(chars[start..i].iter().collect()));
            }
            c if is_word_char(c, false) => {
                let start = i;
                i = scan_word(&chars, start, false);
                push(Token::Word(chars[start..i].iter().collect()));
            }
            other => {
                return Err(error(
                    line,
                    column,
                    format!("unexpected character '{other}'"),
                ))
            }
        }
    }
    tokens.push(Spanned {
        token: Token::Eof,
        line,
        column: i - line_start + 1,
    });
    Ok(tokens)
}

fn punctuation(c: char) -> Token {
    match c {
        '=' => Token::Equals,
        '{' => Token::LBrace,
        '}' => Token::RBrace,
        '[' => Token::LBracket,
        ']' => Token::RBracket,
        ',' => Token::Comma,
        _ => unreachable!("'{c}' is not punctuation; this is a bug"),
    }
}

/// Word characters; names (`%d0.1`) may contain single dots, words may contain `.`, `+`, `-`
/// inside numbers (`5e-6`, `1.5`) but never `..`, and a `:` between word characters
/// (`recompute=block:4`).
fn is_word_char(c: char, in_name: bool) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || (!in_name && c == '+')
}

fn scan_word(chars: &[char], mut i: usize, in_name: bool) -> usize {
    while i < chars.len() {
        let c = chars[i];
        let single_dot = c == '.' && chars.get(i + 1) != Some(&'.');
        let inner_colon = c == ':'
            && !in_name
            && chars
                .get(i + 1)
                .is_some_and(|&next| is_word_char(next, in_name));
        if is_word_char(c, in_name) || single_dot || inner_colon {
            i += 1;
        } else {
            break;
        }
    }
    i
}
