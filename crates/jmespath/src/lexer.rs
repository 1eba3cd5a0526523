//! Tokenizer for the JMESPath 2015 grammar (Kyverno's dialect has no extensions).
//!
//! Produces a flat token list with byte offsets, consumed by [`crate::parser`].

use crate::error::ParseError;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    QuotedIdent(String),
    Number(i64),
    Literal(Value),
    Filter,
    Flatten,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    LParen,
    RParen,
    Dot,
    Star,
    Comma,
    Colon,
    Pipe,
    Or,
    And,
    Not,
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
    Current,
    /// `$name` (community dialect only).
    Variable(String),
    Expref,
    Eof,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    pub pos: usize,
}

pub(crate) fn tokenize(src: &str, dialect: crate::Dialect) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<(usize, char)> = src.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let err =
        |pos: usize, msg: &str| ParseError { expression: src.to_string(), position: pos, message: msg.to_string() };
    while let Some(&(pos, c)) = chars.get(i) {
        let next = chars.get(i + 1).map(|x| x.1);
        let simple = |t: Tok| Token { tok: t, pos };
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                i += 1;
            }
            '.' => {
                out.push(simple(Tok::Dot));
                i += 1;
            }
            '*' => {
                out.push(simple(Tok::Star));
                i += 1;
            }
            ',' => {
                out.push(simple(Tok::Comma));
                i += 1;
            }
            ':' => {
                out.push(simple(Tok::Colon));
                i += 1;
            }
            '{' => {
                out.push(simple(Tok::LBrace));
                i += 1;
            }
            '}' => {
                out.push(simple(Tok::RBrace));
                i += 1;
            }
            ']' => {
                out.push(simple(Tok::RBracket));
                i += 1;
            }
            '(' => {
                out.push(simple(Tok::LParen));
                i += 1;
            }
            ')' => {
                out.push(simple(Tok::RParen));
                i += 1;
            }
            '@' => {
                out.push(simple(Tok::Current));
                i += 1;
            }
            '$' if dialect == crate::Dialect::Community => {
                let mut j = i + 1;
                let mut name = String::new();
                while let Some(&(_, ch)) = chars.get(j)
                    && (ch.is_ascii_alphanumeric() || ch == '_')
                {
                    name.push(ch);
                    j += 1;
                }
                if name.is_empty() {
                    return Err(err(pos, "the root reference `$` is not supported; name a variable (`$name`)"));
                }
                out.push(simple(Tok::Variable(name)));
                i = j;
            }
            '[' => match next {
                Some('?') => {
                    out.push(simple(Tok::Filter));
                    i += 2;
                }
                Some(']') => {
                    out.push(simple(Tok::Flatten));
                    i += 2;
                }
                _ => {
                    out.push(simple(Tok::LBracket));
                    i += 1;
                }
            },
            '|' => {
                if next == Some('|') {
                    out.push(simple(Tok::Or));
                    i += 2;
                } else {
                    out.push(simple(Tok::Pipe));
                    i += 1;
                }
            }
            '&' => {
                if next == Some('&') {
                    out.push(simple(Tok::And));
                    i += 2;
                } else {
                    out.push(simple(Tok::Expref));
                    i += 1;
                }
            }
            '!' => {
                if next == Some('=') {
                    out.push(simple(Tok::Ne));
                    i += 2;
                } else {
                    out.push(simple(Tok::Not));
                    i += 1;
                }
            }
            '=' => {
                if next == Some('=') {
                    out.push(simple(Tok::Eq));
                    i += 2;
                } else {
                    return Err(err(pos, "unexpected '=', expected '=='"));
                }
            }
            '<' => {
                if next == Some('=') {
                    out.push(simple(Tok::Lte));
                    i += 2;
                } else {
                    out.push(simple(Tok::Lt));
                    i += 1;
                }
            }
            '>' => {
                if next == Some('=') {
                    out.push(simple(Tok::Gte));
                    i += 2;
                } else {
                    out.push(simple(Tok::Gt));
                    i += 1;
                }
            }
            '-' | '0'..='9' => {
                let start = i;
                i += 1;
                while chars.get(i).is_some_and(|x| x.1.is_ascii_digit()) {
                    i += 1;
                }
                let end = chars.get(i).map(|x| x.0).unwrap_or(src.len());
                let text = &src[pos..end];
                if text == "-" {
                    return Err(err(pos, "'-' must be followed by a digit"));
                }
                let at = chars.get(start).map_or(pos, |x| x.0);
                let n: i64 = text.parse().map_err(|_| err(at, "invalid number"))?;
                out.push(simple(Tok::Number(n)));
            }
            'a'..='z' | 'A'..='Z' | '_' => {
                let start = pos;
                i += 1;
                while chars.get(i).is_some_and(|x| x.1.is_ascii_alphanumeric() || x.1 == '_') {
                    i += 1;
                }
                let end = chars.get(i).map(|x| x.0).unwrap_or(src.len());
                out.push(simple(Tok::Ident(src[start..end].to_string())));
            }
            '"' => {
                let (text, ni) =
                    delimited(src, &chars, i, '"').ok_or_else(|| err(pos, "unterminated quoted identifier"))?;
                let s: String = serde_json::from_str(&format!("\"{text}\""))
                    .map_err(|e| err(pos, &format!("invalid quoted identifier: {e}")))?;
                out.push(simple(Tok::QuotedIdent(s)));
                i = ni;
            }
            '\'' => {
                let (text, ni) =
                    delimited(src, &chars, i, '\'').ok_or_else(|| err(pos, "unterminated raw string literal"))?;
                out.push(simple(Tok::Literal(Value::String(text.replace("\\'", "'")))));
                i = ni;
            }
            '`' => {
                let (text, ni) = delimited(src, &chars, i, '`').ok_or_else(|| err(pos, "unterminated JSON literal"))?;
                let text = text.replace("\\`", "`");
                let v: Value = match serde_json::from_str(text.trim()) {
                    Ok(v) => v,
                    Err(e) => return Err(err(pos, &format!("invalid JSON literal `{text}`: {e}"))),
                };
                out.push(simple(Tok::Literal(v)));
                i = ni;
            }
            other => return Err(err(pos, &format!("unexpected character '{other}'"))),
        }
    }
    out.push(Token { tok: Tok::Eof, pos: src.len() });
    Ok(out)
}

/// Reads a `q`-delimited run starting at `chars[i] == q`; backslash escapes the delimiter.
/// Returns the raw inner text and the index after the closing delimiter.
fn delimited<'s>(src: &'s str, chars: &[(usize, char)], i: usize, q: char) -> Option<(&'s str, usize)> {
    let start = chars.get(i + 1).map(|x| x.0).unwrap_or(src.len());
    let mut j = i + 1;
    while let Some(&(at, c)) = chars.get(j) {
        if c == '\\' {
            j += 2;
            continue;
        }
        if c == q {
            return Some((&src[start..at], j + 1));
        }
        j += 1;
    }
    None
}
