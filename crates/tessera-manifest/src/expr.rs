//! Handoff conditions such as `${interview_complete} == True`: parsed once at load into an
//! [`Expr`] so a typo fails validation instead of silently never firing at run time.
//!
//! Grammar:
//! ```text
//! expr    := or
//! or      := and ("or" and)*
//! and     := not ("and" not)*
//! not     := "not" not | cmp
//! cmp     := primary (("==" | "!=") primary)?
//! primary := "${" ident "}" | 'str' | "str" | number | True | False | true | false
//!          | None | null | "(" expr ")"
//! ```

use std::fmt;

use serde_json::{Map, Number, Value};

/// Deepest nesting accepted, so hostile input cannot overflow the stack.
const MAX_DEPTH: usize = 64;

/// A parsed handoff condition; evaluating it against the context variables decides a handoff.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `${name}`: the current value of a context variable (null when unset).
    Var(String),
    /// A literal string, number, boolean or null.
    Literal(Value),
    /// `not e`: logical negation of `e`'s truthiness.
    Not(Box<Expr>),
    /// `a and b`: both truthy.
    And(Box<Expr>, Box<Expr>),
    /// `a or b`: either truthy.
    Or(Box<Expr>, Box<Expr>),
    /// `a == b`: same JSON type and equal (numbers compare numerically).
    Eq(Box<Expr>, Box<Expr>),
    /// `a != b`: the negation of `==`.
    Ne(Box<Expr>, Box<Expr>),
}

/// Why a condition could not be parsed, with the byte offset, so authors can find the mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at position {position}")]
pub struct ExprError {
    /// Byte offset in the condition text.
    pub position: usize,
    /// What was expected or found.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Var(String),
    Lit(Value),
    And,
    Or,
    Not,
    EqEq,
    NotEq,
    LParen,
    RParen,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Var(n) => write!(f, "${{{n}}}"),
            Tok::Lit(v) => write!(f, "{v}"),
            Tok::And => f.write_str("and"),
            Tok::Or => f.write_str("or"),
            Tok::Not => f.write_str("not"),
            Tok::EqEq => f.write_str("=="),
            Tok::NotEq => f.write_str("!="),
            Tok::LParen => f.write_str("("),
            Tok::RParen => f.write_str(")"),
        }
    }
}

fn err<T>(position: usize, message: impl Into<String>) -> Result<T, ExprError> {
    Err(ExprError {
        position,
        message: message.into(),
    })
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, ExprError> {
    let mut out = Vec::new();
    let mut it = src.char_indices().peekable();
    while let Some(&(pos, c)) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        match c {
            '(' => {
                it.next();
                out.push((pos, Tok::LParen));
            }
            ')' => {
                it.next();
                out.push((pos, Tok::RParen));
            }
            '=' | '!' => {
                it.next();
                if matches!(it.peek(), Some((_, '='))) {
                    it.next();
                    out.push((pos, if c == '=' { Tok::EqEq } else { Tok::NotEq }));
                } else {
                    return err(pos, format!("expected \"{c}=\""));
                }
            }
            '$' => {
                it.next();
                if !matches!(it.next(), Some((_, '{'))) {
                    return err(pos, "expected \"${\" to start a variable reference");
                }
                let mut name = String::new();
                loop {
                    match it.next() {
                        Some((_, '}')) => break,
                        Some((_, ch)) if ch.is_ascii_alphanumeric() || ch == '_' => name.push(ch),
                        Some((p, ch)) => {
                            return err(p, format!("unexpected {ch:?} in variable name"));
                        }
                        None => return err(pos, "unterminated \"${\"; close it with \"}\""),
                    }
                }
                if !crate::json::is_ident(&name) {
                    return err(pos, format!("invalid variable name \"{name}\""));
                }
                out.push((pos, Tok::Var(name)));
            }
            '\'' | '"' => {
                it.next();
                let mut s = String::new();
                loop {
                    match it.next() {
                        Some((_, ch)) if ch == c => break,
                        Some((p, '\\')) => match it.next() {
                            Some((_, 'n')) => s.push('\n'),
                            Some((_, 't')) => s.push('\t'),
                            Some((_, ch @ ('\\' | '\'' | '"'))) => s.push(ch),
                            _ => return err(p, "invalid escape in string literal"),
                        },
                        Some((_, ch)) => s.push(ch),
                        None => return err(pos, "unterminated string literal"),
                    }
                }
                out.push((pos, Tok::Lit(Value::String(s))));
            }
            c if c.is_ascii_digit() || c == '-' || c == '.' => {
                let mut text = String::new();
                while let Some(&(_, ch)) = it.peek() {
                    if ch.is_ascii_alphanumeric() || ch == '.' || ch == '-' || ch == '+' {
                        text.push(ch);
                        it.next();
                    } else {
                        break;
                    }
                }
                out.push((
                    pos,
                    Tok::Lit(number(&text).ok_or_else(|| bad_number(pos, &text))?),
                ));
            }
            c if c.is_alphabetic() || c == '_' => {
                let mut word = String::new();
                while let Some(&(_, ch)) = it.peek() {
                    if ch.is_alphanumeric() || ch == '_' {
                        word.push(ch);
                        it.next();
                    } else {
                        break;
                    }
                }
                let tok = match word.as_str() {
                    "and" => Tok::And,
                    "or" => Tok::Or,
                    "not" => Tok::Not,
                    "True" | "true" => Tok::Lit(Value::Bool(true)),
                    "False" | "false" => Tok::Lit(Value::Bool(false)),
                    "None" | "null" => Tok::Lit(Value::Null),
                    _ => {
                        return err(
                            pos,
                            format!(
                                "unknown word \"{word}\"; write variables as ${{{word}}} and strings in quotes"
                            ),
                        );
                    }
                };
                out.push((pos, tok));
            }
            other => return err(pos, format!("unexpected character {other:?}")),
        }
    }
    Ok(out)
}

fn bad_number(pos: usize, text: &str) -> ExprError {
    ExprError {
        position: pos,
        message: format!("invalid number \"{text}\""),
    }
}

fn number(text: &str) -> Option<Value> {
    if let Ok(i) = text.parse::<i64>() {
        return Some(Value::Number(i.into()));
    }
    let f = text.parse::<f64>().ok()?;
    Number::from_f64(f).map(Value::Number)
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    end: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }

    fn here(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |(p, _)| *p)
    }

    fn enter(&mut self) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(
                self.here(),
                format!("condition nested deeper than {MAX_DEPTH} levels"),
            );
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, ExprError> {
        self.enter()?;
        let mut left = self.and()?;
        while self.peek() == Some(&Tok::Or) {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.not()?;
        while self.peek() == Some(&Tok::And) {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, ExprError> {
        if self.peek() == Some(&Tok::Not) {
            self.pos += 1;
            self.enter()?;
            let inner = self.not()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Expr, ExprError> {
        let left = self.primary()?;
        match self.peek() {
            Some(Tok::EqEq) => {
                self.pos += 1;
                Ok(Expr::Eq(Box::new(left), Box::new(self.primary()?)))
            }
            Some(Tok::NotEq) => {
                self.pos += 1;
                Ok(Expr::Ne(Box::new(left), Box::new(self.primary()?)))
            }
            _ => Ok(left),
        }
    }

    fn primary(&mut self) -> Result<Expr, ExprError> {
        let at = self.here();
        let Some(tok) = self.peek().cloned() else {
            return err(at, "unexpected end of condition; expected a value");
        };
        self.pos += 1;
        match tok {
            Tok::Var(name) => Ok(Expr::Var(name)),
            Tok::Lit(v) => Ok(Expr::Literal(v)),
            Tok::LParen => {
                let inner = self.or()?;
                if self.peek() == Some(&Tok::RParen) {
                    self.pos += 1;
                    Ok(inner)
                } else {
                    err(self.here(), "expected \")\"")
                }
            }
            other => err(at, format!("unexpected \"{other}\"; expected a value")),
        }
    }
}

impl Expr {
    /// Parses a condition; used at load so errors surface in `tessera validate`.
    pub fn parse(src: &str) -> Result<Expr, ExprError> {
        let toks = lex(src)?;
        if toks.is_empty() {
            return err(0, "empty condition");
        }
        let mut p = Parser {
            toks,
            pos: 0,
            end: src.len(),
            depth: 0,
        };
        let e = p.or()?;
        match p.toks.get(p.pos) {
            None => Ok(e),
            Some((at, t)) => err(
                *at,
                format!("unexpected \"{t}\" after a complete condition"),
            ),
        }
    }

    /// Decides the condition against the current context variables. Never panics: a missing
    /// variable is null, and values of different JSON types are simply unequal.
    pub fn eval(&self, vars: &Map<String, Value>) -> bool {
        truthy(&self.value(vars))
    }

    /// Names of all `${...}` variables used, so the loader can check they are declared.
    pub fn variables(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_vars(&mut out);
        out
    }

    fn collect_vars<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Expr::Var(n) => out.push(n),
            Expr::Literal(_) => {}
            Expr::Not(e) => e.collect_vars(out),
            Expr::And(a, b) | Expr::Or(a, b) | Expr::Eq(a, b) | Expr::Ne(a, b) => {
                a.collect_vars(out);
                b.collect_vars(out);
            }
        }
    }

    fn value(&self, vars: &Map<String, Value>) -> Value {
        match self {
            Expr::Var(n) => vars.get(n).cloned().unwrap_or(Value::Null),
            Expr::Literal(v) => v.clone(),
            Expr::Not(e) => Value::Bool(!e.eval(vars)),
            Expr::And(a, b) => Value::Bool(a.eval(vars) && b.eval(vars)),
            Expr::Or(a, b) => Value::Bool(a.eval(vars) || b.eval(vars)),
            Expr::Eq(a, b) => Value::Bool(equal(&a.value(vars), &b.value(vars))),
            Expr::Ne(a, b) => Value::Bool(!equal(&a.value(vars), &b.value(vars))),
        }
    }
}

impl std::str::FromStr for Expr {
    type Err = ExprError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Expr::parse(s)
    }
}

/// Python-like truthiness: null, false, 0, "", [] and {} are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Equality of two JSON values; numbers compare numerically (1 == 1.0), other types strictly.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64().zip(y.as_f64()).is_some_and(|(f, g)| f == g),
            },
        },
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn eval(src: &str, v: Value) -> bool {
        match Expr::parse(src) {
            Ok(e) => e.eval(&vars(v)),
            Err(e) => panic!("{src}: {e}"),
        }
    }

    #[test]
    fn spec_condition() {
        assert!(eval(
            "${interview_complete} == True",
            json!({"interview_complete": true})
        ));
        assert!(!eval(
            "${interview_complete} == True",
            json!({"interview_complete": false})
        ));
        assert!(!eval("${interview_complete} == True", json!({})));
    }

    #[test]
    fn precedence_and_binds_tighter_than_or() {
        // a or (b and c)
        assert!(eval(
            "${a} or ${b} and ${c}",
            json!({"a": true, "b": false, "c": false})
        ));
        // (a or b) and c
        assert!(!eval(
            "(${a} or ${b}) and ${c}",
            json!({"a": true, "b": false, "c": false})
        ));
        assert_eq!(
            Expr::parse("${a} or ${b} and ${c}").ok(),
            Some(Expr::Or(
                Box::new(Expr::Var("a".into())),
                Box::new(Expr::And(
                    Box::new(Expr::Var("b".into())),
                    Box::new(Expr::Var("c".into()))
                ))
            ))
        );
    }

    #[test]
    fn not_binds_looser_than_comparison() {
        // not (a == 1)
        assert!(eval("not ${a} == 1", json!({"a": 2})));
        assert!(!eval("not ${a} == 1", json!({"a": 1})));
        assert!(eval("not not ${a}", json!({"a": "x"})));
        assert!(eval("not ${a} and ${b}", json!({"a": false, "b": true})));
    }

    #[test]
    fn literals() {
        assert!(eval("${s} == 'success'", json!({"s": "success"})));
        assert!(eval("${s} == \"success\"", json!({"s": "success"})));
        assert!(eval("${s} == 'it\\'s'", json!({"s": "it's"})));
        assert!(eval("${n} == 3", json!({"n": 3})));
        assert!(eval("${n} == 3.0", json!({"n": 3})));
        assert!(eval("${n} == -2.5", json!({"n": -2.5})));
        assert!(eval("${b} == true", json!({"b": true})));
        assert!(eval("${b} == False", json!({"b": false})));
        assert!(eval("${x} == None", json!({})));
        assert!(eval("${x} == null", json!({"x": null})));
        assert!(eval("True", json!({})));
        assert!(!eval("0", json!({})));
    }

    #[test]
    fn missing_variables_are_null() {
        assert!(!eval("${nope}", json!({})));
        assert!(eval("not ${nope}", json!({})));
        assert!(eval("${nope} != 'x'", json!({})));
        assert!(!eval("${nope} == False", json!({})));
    }

    #[test]
    fn type_mismatch_is_unequal() {
        assert!(!eval("${a} == 1", json!({"a": "1"})));
        assert!(eval("${a} != 1", json!({"a": "1"})));
        assert!(!eval("${a} == True", json!({"a": 1})));
        assert!(!eval("${a} == 'x'", json!({"a": ["x"]})));
    }

    #[test]
    fn truthiness() {
        assert!(!eval("${a}", json!({"a": ""})));
        assert!(eval("${a}", json!({"a": "x"})));
        assert!(!eval("${a}", json!({"a": []})));
        assert!(eval("${a}", json!({"a": {"k": 1}})));
        assert!(!eval("${a}", json!({"a": 0.0})));
    }

    #[test]
    fn variables_are_listed() {
        let e = Expr::parse("${a} == 1 or not (${b} and ${a})").ok();
        assert_eq!(e.map(|e| e.variables().len()), Some(3));
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "   ",
            "${a",
            "${}",
            "${a-b}",
            "${a} =",
            "${a} = 1",
            "${a} == ",
            "(${a}",
            "${a})",
            "${a} ${b}",
            "'open",
            "interview_complete == True",
            "${a} == 1 == 2",
            "and",
            "1.2.3",
            "#",
        ] {
            assert!(Expr::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn deep_nesting_is_rejected_not_overflowing() {
        let deep = format!("{}${{a}}{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(Expr::parse(&deep).is_err());
        let nots = format!("{}${{a}}", "not ".repeat(10_000));
        assert!(Expr::parse(&nots).is_err());
        let ok = format!("{}${{a}}{}", "(".repeat(20), ")".repeat(20));
        assert!(Expr::parse(&ok).is_ok());
    }
}
