//! Top-down operator-precedence (Pratt) parser for the JMESPath 2015 grammar.
//!
//! Function names are resolved against the registry here, so an unknown function is a
//! compile-time error rather than a surprise at evaluation.

use crate::ast::{Ast, Comparator};
use crate::error::ParseError;
use crate::functions;
use crate::lexer::{Tok, Token, tokenize};

/// Maximum nesting depth, so hostile input cannot overflow the stack.
const MAX_DEPTH: usize = 256;

fn binding_power(t: &Tok) -> u8 {
    match t {
        Tok::Pipe => 1,
        Tok::Or => 2,
        Tok::And => 3,
        Tok::Eq | Tok::Ne | Tok::Lt | Tok::Lte | Tok::Gt | Tok::Gte => 5,
        Tok::Flatten => 9,
        Tok::Star => 20,
        Tok::Filter => 21,
        Tok::Dot => 40,
        Tok::Not => 45,
        Tok::LBrace => 50,
        Tok::LBracket => 55,
        Tok::LParen => 60,
        _ => 0,
    }
}

pub(crate) struct Parser<'s> {
    src: &'s str,
    tokens: Vec<Token>,
    i: usize,
    depth: usize,
    dialect: crate::Dialect,
}

pub(crate) fn parse(src: &str, dialect: crate::Dialect) -> Result<Ast, ParseError> {
    let tokens = tokenize(src, dialect)?;
    let mut p = Parser { src, tokens, i: 0, depth: 0, dialect };
    let ast = p.expression(0)?;
    if p.peek() != &Tok::Eof {
        return Err(p.error(&format!("unexpected token {:?}", p.peek())));
    }
    Ok(ast)
}

impl<'s> Parser<'s> {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.i).map(|t| &t.tok).unwrap_or(&Tok::Eof)
    }
    fn peek_at(&self, n: usize) -> &Tok {
        self.tokens.get(self.i + n).map(|t| &t.tok).unwrap_or(&Tok::Eof)
    }
    fn pos(&self) -> usize {
        self.tokens.get(self.i).map(|t| t.pos).unwrap_or(self.src.len())
    }
    fn advance(&mut self) -> Tok {
        let t = self.tokens.get(self.i).map(|t| t.tok.clone()).unwrap_or(Tok::Eof);
        if self.i < self.tokens.len() {
            self.i += 1;
        }
        t
    }
    fn error(&self, msg: &str) -> ParseError {
        ParseError { expression: self.src.to_string(), position: self.pos(), message: msg.to_string() }
    }
    fn expect(&mut self, t: Tok) -> Result<(), ParseError> {
        if *self.peek() == t {
            self.advance();
            Ok(())
        } else {
            Err(self.error(&format!("expected {:?}, found {:?}", t, self.peek())))
        }
    }

    /// `depth` is the depth of the tree being built, not only of this call stack: every
    /// operator in a chain (`a.b.c…`, `x | y | z…`, `a[0][0]…`) wraps the tree one level deeper
    /// although the loop below does not recurse, and evaluating or dropping the tree recurses
    /// through every level. A chain of thousands of `.a` must be refused here, not overflow
    /// the stack later.
    fn expression(&mut self, rbp: u8) -> Result<Ast, ParseError> {
        let entry = self.depth;
        self.deeper()?;
        let tok = self.advance();
        let mut left = self.nud(tok)?;
        while rbp < binding_power(self.peek()) {
            self.deeper()?;
            let tok = self.advance();
            left = self.led(tok, left)?;
        }
        self.depth = entry;
        Ok(left)
    }

    fn deeper(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { Err(self.error("expression nested too deeply")) } else { Ok(()) }
    }

    fn nud(&mut self, tok: Tok) -> Result<Ast, ParseError> {
        match tok {
            Tok::Literal(v) => Ok(Ast::Literal(v)),
            Tok::Ident(name) => Ok(Ast::Field(name)),
            Tok::Variable(name) => Ok(Ast::Variable(name)),
            Tok::QuotedIdent(name) => {
                if *self.peek() == Tok::LParen {
                    return Err(self.error("can't use a quoted identifier as a function name"));
                }
                Ok(Ast::Field(name))
            }
            Tok::Star => {
                let rhs = self.projection_rhs(binding_power(&Tok::Star))?;
                Ok(Ast::ValueProjection(Box::new(Ast::Identity), Box::new(rhs)))
            }
            Tok::Filter => self.filter(Ast::Identity),
            Tok::LBrace => self.multi_hash(),
            Tok::Flatten => {
                let rhs = self.projection_rhs(binding_power(&Tok::Flatten))?;
                Ok(Ast::Projection(Box::new(Ast::Flatten(Box::new(Ast::Identity))), Box::new(rhs)))
            }
            Tok::LBracket => match self.peek() {
                Tok::Number(_) | Tok::Colon => {
                    let idx = self.index_expr()?;
                    self.project_if_slice(Ast::Identity, idx)
                }
                Tok::Star if *self.peek_at(1) == Tok::RBracket => {
                    self.advance();
                    self.advance();
                    let rhs = self.projection_rhs(binding_power(&Tok::Star))?;
                    Ok(Ast::Projection(Box::new(Ast::Identity), Box::new(rhs)))
                }
                _ => self.multi_list(),
            },
            Tok::Current => Ok(Ast::Identity),
            Tok::Expref => Ok(Ast::Expref(Box::new(self.expression(binding_power(&Tok::Expref))?))),
            Tok::Not => Ok(Ast::Not(Box::new(self.expression(binding_power(&Tok::Not))?))),
            Tok::LParen => {
                let e = self.expression(0)?;
                self.expect(Tok::RParen)?;
                Ok(e)
            }
            Tok::Eof => Err(self.error("incomplete expression")),
            other => Err(self.error(&format!("unexpected token {other:?}"))),
        }
    }

    fn led(&mut self, tok: Tok, left: Ast) -> Result<Ast, ParseError> {
        match tok {
            Tok::Dot => {
                if *self.peek() == Tok::Star {
                    self.advance();
                    let rhs = self.projection_rhs(binding_power(&Tok::Dot))?;
                    Ok(Ast::ValueProjection(Box::new(left), Box::new(rhs)))
                } else {
                    let rhs = self.dot_rhs(binding_power(&Tok::Dot))?;
                    Ok(Ast::Subexpr(Box::new(left), Box::new(rhs)))
                }
            }
            Tok::Pipe => Ok(Ast::Pipe(Box::new(left), Box::new(self.expression(binding_power(&Tok::Pipe))?))),
            Tok::Or => Ok(Ast::Or(Box::new(left), Box::new(self.expression(binding_power(&Tok::Or))?))),
            Tok::And => Ok(Ast::And(Box::new(left), Box::new(self.expression(binding_power(&Tok::And))?))),
            Tok::LParen => {
                let name = match left {
                    Ast::Field(n) => n,
                    _ => return Err(self.error("invalid function call target")),
                };
                let mut args = Vec::new();
                while *self.peek() != Tok::RParen {
                    args.push(self.expression(0)?);
                    if *self.peek() == Tok::Comma {
                        self.advance();
                    } else if *self.peek() != Tok::RParen {
                        return Err(self.error("expected ',' or ')' in function arguments"));
                    }
                }
                self.advance();
                let f = functions::lookup_in(&name, self.dialect)
                    .ok_or_else(|| self.error(&format!("unknown function: {name}()")))?;
                f.check_arity(args.len()).map_err(|e| self.error(&e.to_string()))?;
                Ok(Ast::Call(f, args))
            }
            Tok::Filter => self.filter(left),
            Tok::Flatten => {
                let rhs = self.projection_rhs(binding_power(&Tok::Flatten))?;
                Ok(Ast::Projection(Box::new(Ast::Flatten(Box::new(left))), Box::new(rhs)))
            }
            Tok::LBracket => match self.peek() {
                Tok::Number(_) | Tok::Colon => {
                    let idx = self.index_expr()?;
                    self.project_if_slice(left, idx)
                }
                _ => {
                    self.expect(Tok::Star)?;
                    self.expect(Tok::RBracket)?;
                    let rhs = self.projection_rhs(binding_power(&Tok::Star))?;
                    Ok(Ast::Projection(Box::new(left), Box::new(rhs)))
                }
            },
            Tok::Eq | Tok::Ne | Tok::Lt | Tok::Lte | Tok::Gt | Tok::Gte => {
                let cmp = match tok {
                    Tok::Eq => Comparator::Eq,
                    Tok::Ne => Comparator::Ne,
                    Tok::Lt => Comparator::Lt,
                    Tok::Lte => Comparator::Lte,
                    Tok::Gt => Comparator::Gt,
                    _ => Comparator::Gte,
                };
                let right = self.expression(binding_power(&Tok::Eq))?;
                Ok(Ast::Compare(cmp, Box::new(left), Box::new(right)))
            }
            other => Err(self.error(&format!("unexpected token {other:?}"))),
        }
    }

    /// Parses `[n]`, `[a:b:c]` after the opening bracket.
    fn index_expr(&mut self) -> Result<Ast, ParseError> {
        let mut parts: [Option<i64>; 3] = [None, None, None];
        let mut idx = 0usize;
        let mut colons = 0;
        loop {
            match self.peek().clone() {
                Tok::RBracket => {
                    self.advance();
                    break;
                }
                Tok::Colon => {
                    self.advance();
                    colons += 1;
                    idx += 1;
                    if idx > 2 {
                        return Err(self.error("too many colons in slice expression"));
                    }
                }
                Tok::Number(n) => {
                    self.advance();
                    if let Some(slot) = parts.get_mut(idx) {
                        *slot = Some(n);
                    }
                }
                other => return Err(self.error(&format!("unexpected token {other:?} in index expression"))),
            }
        }
        if colons == 0 {
            match parts[0] {
                Some(n) => Ok(Ast::Index(n)),
                None => Err(self.error("empty index expression")),
            }
        } else {
            if parts[2] == Some(0) {
                return Err(self.error("slice step cannot be 0"));
            }
            Ok(Ast::Slice { start: parts[0], stop: parts[1], step: parts[2] })
        }
    }

    fn project_if_slice(&mut self, left: Ast, idx: Ast) -> Result<Ast, ParseError> {
        let is_slice = matches!(idx, Ast::Slice { .. });
        let indexed = Ast::Subexpr(Box::new(left), Box::new(idx));
        if is_slice {
            let rhs = self.projection_rhs(binding_power(&Tok::Star))?;
            Ok(Ast::Projection(Box::new(indexed), Box::new(rhs)))
        } else {
            Ok(indexed)
        }
    }

    fn filter(&mut self, left: Ast) -> Result<Ast, ParseError> {
        let cond = self.expression(0)?;
        self.expect(Tok::RBracket)?;
        let rhs = if *self.peek() == Tok::Flatten {
            Ast::Identity
        } else {
            self.projection_rhs(binding_power(&Tok::Filter))?
        };
        Ok(Ast::FilterProjection { lhs: Box::new(left), rhs: Box::new(rhs), cond: Box::new(cond) })
    }

    fn multi_list(&mut self) -> Result<Ast, ParseError> {
        let mut items = Vec::new();
        loop {
            items.push(self.expression(0)?);
            match self.peek() {
                Tok::Comma => {
                    self.advance();
                }
                Tok::RBracket => {
                    self.advance();
                    break;
                }
                other => return Err(self.error(&format!("expected ',' or ']', found {other:?}"))),
            }
        }
        Ok(Ast::MultiList(items))
    }

    fn multi_hash(&mut self) -> Result<Ast, ParseError> {
        let mut items = Vec::new();
        loop {
            let key = match self.advance() {
                Tok::Ident(k) | Tok::QuotedIdent(k) => k,
                other => return Err(self.error(&format!("expected a key name in multiselect hash, found {other:?}"))),
            };
            self.expect(Tok::Colon)?;
            let v = self.expression(0)?;
            items.push((key, v));
            // Like go-jmespath (Kyverno's), a missing comma before the next key is tolerated.
            match self.peek() {
                Tok::Comma => {
                    self.advance();
                }
                Tok::RBrace => {
                    self.advance();
                    break;
                }
                Tok::Ident(_) | Tok::QuotedIdent(_) => {}
                other => return Err(self.error(&format!("expected ',' or '}}', found {other:?}"))),
            }
        }
        Ok(Ast::MultiHash(items))
    }

    fn dot_rhs(&mut self, bp: u8) -> Result<Ast, ParseError> {
        match self.peek() {
            Tok::Ident(_) | Tok::QuotedIdent(_) | Tok::Star => self.expression(bp),
            Tok::LBracket => {
                self.advance();
                self.multi_list()
            }
            Tok::LBrace => {
                self.advance();
                self.multi_hash()
            }
            other => Err(self.error(&format!("expected identifier, '[' or '{{' after '.', found {other:?}"))),
        }
    }

    fn projection_rhs(&mut self, bp: u8) -> Result<Ast, ParseError> {
        let t = self.peek().clone();
        if binding_power(&t) < 10 {
            return Ok(Ast::Identity);
        }
        match t {
            Tok::LBracket | Tok::Filter => self.expression(bp),
            Tok::Dot => {
                self.advance();
                self.dot_rhs(bp)
            }
            other => Err(self.error(&format!("unexpected token {other:?} after projection"))),
        }
    }
}

#[cfg(test)]
mod lenient_tests {
    #[test]
    fn multiselect_hash_tolerates_a_missing_comma_like_go_jmespath() {
        let e = crate::Expression::compile("{a: `1`\n b: `2`}");
        assert!(e.is_ok());
        assert!(crate::Expression::compile("{a: `1` ]").is_err());
    }
}
