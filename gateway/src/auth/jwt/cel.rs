//! CEL for claim mappings and rules, through the `cel` crate (cel-rust): the maintained Rust
//! implementation of the language kube evaluates these with (cel-go). Each expression is
//! compiled once per configuration; evaluation sees `claims` (the token's claims, a map) or
//! `user` (`username`, `uid`, `groups`, `extra`), as kube's two environments do.
//!
//! Where cel-rust differs from kube's cel-go: it has no type checker, so a result of the wrong
//! type is refused when evaluated (kube refuses it when compiling), and no cost estimator, so the
//! bound on an expression's work is the token's size (`jws::MAX_TOKEN_BYTES`) and the parser's
//! nesting limit rather than kube's cost units.

use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::{Context, Env, Program, Value};
use gateway_config::authentication::{CompiledExpression, ExpressionCompiler, ExpressionKind};
use serde_json::{Map, Value as Json};

use crate::identity::UserInfo;

/// One compiled expression.
pub struct Expression {
    program: Program,
    pub source: String,
}

/// Compiles expressions with one shared standard environment.
#[derive(Clone)]
pub struct Compiler {
    env: Arc<Env>,
}

impl Default for Compiler {
    fn default() -> Self {
        Self {
            env: Arc::new(Env::stdlib()),
        }
    }
}

impl Compiler {
    pub fn compile(&self, source: &str) -> Result<Expression, String> {
        let program = self
            .env
            .compile(source)
            .map_err(|e| format!("compilation failed: {e}"))?;
        Ok(Expression {
            program,
            source: source.to_owned(),
        })
    }

    /// A context holding `name` bound to `value`, for one evaluation.
    pub fn context(&self, name: &str, value: Value) -> Context<'static, 'static> {
        let mut context = Context::with_env(self.env.clone());
        context.add_variable_from_value(name, value);
        context
    }
}

impl ExpressionCompiler for Compiler {
    fn compile(&self, _: ExpressionKind, source: &str) -> Result<CompiledExpression, String> {
        let compiled = Compiler::compile(self, source)?;
        let root = compiled.program.expression();
        Ok(CompiledExpression {
            uses_email: selects(root, "claims", "email"),
            uses_email_verified: selects(root, "claims", "email_verified"),
        })
    }
}

/// The claims as CEL sees them.
pub fn claims_value(claims: &Map<String, Json>) -> Result<Value, String> {
    cel::to_value(claims).map_err(|e| format!("claims cannot be read by CEL: {e}"))
}

/// The user as kube's `kubernetes.UserInfo` CEL type shows it.
pub fn user_value(user: &UserInfo) -> Result<Value, String> {
    let value = serde_json::json!({
        "username": user.name,
        "uid": user.uid,
        "groups": user.groups,
        "extra": user.extra,
    });
    cel::to_value(value).map_err(|e| format!("user cannot be read by CEL: {e}"))
}

impl Expression {
    fn eval(&self, context: &Context<'_, '_>) -> Result<Value, String> {
        self.program.execute(context).map_err(|e| e.to_string())
    }

    /// A string (username, uid).
    pub fn string(&self, context: &Context<'_, '_>) -> Result<String, String> {
        match self.eval(context)? {
            Value::String(s) => Ok(s.to_string()),
            _ => Err("expression must return a string".into()),
        }
    }

    /// A string or a list of strings (groups, extra), as kube's `convertCELValueToStringList`.
    pub fn strings(&self, context: &Context<'_, '_>) -> Result<Vec<String>, String> {
        // Empty strings are dropped, as kube drops them.
        const WRONG: &str = "expression must return a string or a list of strings";
        match self.eval(context)? {
            Value::String(s) if s.is_empty() => Ok(Vec::new()),
            Value::String(s) => Ok(vec![s.to_string()]),
            Value::List(items) => items
                .iter()
                .filter(|v| !matches!(v, Value::String(s) if s.is_empty()))
                .map(|v| match v {
                    Value::String(s) => Ok(s.to_string()),
                    _ => Err(WRONG.to_owned()),
                })
                .collect(),
            Value::Null => Ok(Vec::new()),
            _ => Err(WRONG.into()),
        }
    }

    /// A rule's verdict.
    pub fn boolean(&self, context: &Context<'_, '_>) -> Result<bool, String> {
        match self.eval(context)? {
            Value::Bool(b) => Ok(b),
            _ => Err("validation expression must return a boolean".into()),
        }
    }
}

/// Whether the expression selects `operand.field` anywhere (`claims.email`, `has(claims.email)`,
/// `claims.?email`), walked with an explicit stack.
fn selects(root: &IdedExpr, operand: &str, field: &str) -> bool {
    let is_operand = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(name) if name == operand);
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        match &node.expr {
            Expr::Select(s) => {
                if s.field == field && is_operand(&s.operand) {
                    return true;
                }
                stack.push(&s.operand);
            }
            Expr::Call(c) => {
                if c.func_name == "_?._"
                    && c.args.len() == 2
                    && is_operand(&c.args[0])
                    && matches!(&c.args[1].expr, Expr::Literal(LiteralValue::String(s)) if s.inner() == field)
                {
                    return true;
                }
                stack.extend(c.args.iter());
                stack.extend(c.target.as_deref());
            }
            Expr::List(l) => stack.extend(l.elements.iter()),
            Expr::Map(m) => push_entries(&mut stack, &m.entries),
            Expr::Struct(s) => push_entries(&mut stack, &s.entries),
            Expr::Comprehension(c) => stack.extend([
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]),
            _ => {}
        }
    }
    false
}

fn push_entries<'a>(stack: &mut Vec<&'a IdedExpr>, entries: &'a [cel::common::ast::IdedEntryExpr]) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(f) => stack.push(&f.value),
            EntryExpr::MapEntry(m) => stack.extend([&m.key, &m.value]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims() -> Map<String, Json> {
        json!({"sub": "alice", "email": "a@x.io", "groups": ["g1", "g2"], "n": 3})
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn mappings_evaluate_over_the_claims() {
        let compiler = Compiler::default();
        let ctx = compiler.context("claims", claims_value(&claims()).unwrap());
        let e = compiler.compile("'oidc:' + claims.sub").unwrap();
        assert_eq!(e.string(&ctx).unwrap(), "oidc:alice");
        let e = compiler.compile("claims.groups.map(g, 'x:' + g)").unwrap();
        assert_eq!(e.strings(&ctx).unwrap(), ["x:g1", "x:g2"]);
        let e = compiler.compile("claims.sub").unwrap();
        assert_eq!(e.strings(&ctx).unwrap(), ["alice"]);
        let e = compiler.compile("['', 'a', '']").unwrap();
        assert_eq!(e.strings(&ctx).unwrap(), ["a"], "empty strings are dropped");
        assert!(compiler
            .compile("''")
            .unwrap()
            .strings(&ctx)
            .unwrap()
            .is_empty());
        let e = compiler.compile("claims.n").unwrap();
        assert!(e.string(&ctx).is_err(), "a number is not a username");
        let e = compiler.compile("has(claims.missing)").unwrap();
        assert!(!e.boolean(&ctx).unwrap());
        assert!(compiler.compile("claims.sub +").is_err());
    }

    #[test]
    fn email_use_is_found_wherever_it_is() {
        let c = Compiler::default();
        let uses =
            |s: &str| ExpressionCompiler::compile(&c, ExpressionKind::ClaimMapping, s).unwrap();
        assert!(uses("claims.email").uses_email);
        assert!(!uses("claims.email").uses_email_verified);
        let both = uses("claims.email_verified ? claims.email : claims.sub");
        assert!(both.uses_email && both.uses_email_verified);
        assert!(uses("has(claims.email_verified) && claims.email_verified").uses_email_verified);
        assert!(uses("[claims.sub].map(x, claims.email)").uses_email);
        assert!(!uses("claims.emails").uses_email);
    }
}
