//! A persistent kernel's handoffs, read off its body: a `Published` parameter that the body
//! waits on (`p.wait(..)`, `p.get(..)`) but never publishes (`p.publish(..)`) nor hands to a
//! function (which may publish it) can only be waited on forever, so it is a compile error.
//! A buffer handed to a stage function is the function's business: a wait that no block's
//! publish ever satisfies there is reported by the emulator as a deadlock naming the flag.

use super::ast::{Kernel, ParamKind};
use super::valid::Errors;
use proc_macro2::{Span, TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Error, Expr, ExprMethodCall, ExprPath, Ident, Macro};

#[derive(Default)]
struct Uses {
    /// The first `wait` or `get` call on the buffer.
    wait: Option<Span>,
    /// A `publish` call, or the buffer handed on (to a function, a closure, a binding).
    published_or_handed: bool,
}

struct Body<'k> {
    buffers: Vec<(&'k Ident, Uses)>,
}

impl Body<'_> {
    fn uses(&mut self, ident: &Ident) -> Option<&mut Uses> {
        self.buffers.iter_mut().find(|(p, _)| *p == ident).map(|(_, uses)| uses)
    }

    /// Any mention of a buffer inside a macro's tokens counts as handing it on.
    fn tokens(&mut self, tokens: TokenStream) {
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) => {
                    if let Some(uses) = self.uses(&ident) {
                        uses.published_or_handed = true;
                    }
                }
                TokenTree::Group(group) => self.tokens(group.stream()),
                _ => {}
            }
        }
    }
}

fn buffer(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(path) => path.path.get_ident(),
        Expr::Paren(inner) => buffer(&inner.expr),
        _ => None,
    }
}

impl<'ast> Visit<'ast> for Body<'_> {
    fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
        let Some(uses) = buffer(&call.receiver).and_then(|ident| self.uses(ident)) else {
            return visit::visit_expr_method_call(self, call);
        };
        match call.method.to_string().as_str() {
            "wait" | "get" => {
                uses.wait.get_or_insert(call.span());
            }
            "publish" | "clone" => uses.published_or_handed = true,
            _ => {}
        }
        call.args.iter().for_each(|arg| self.visit_expr(arg));
    }

    fn visit_expr_path(&mut self, path: &'ast ExprPath) {
        if let Some(uses) = path.path.get_ident().and_then(|ident| self.uses(ident)) {
            uses.published_or_handed = true;
        }
    }

    fn visit_macro(&mut self, mac: &'ast Macro) {
        self.tokens(mac.tokens.clone());
    }
}

pub fn check(kernel: &Kernel, errors: &mut Errors) {
    let buffers = kernel.params.iter().filter(|p| matches!(p.kind, ParamKind::Published(_))).map(|p| (&p.ident, Uses::default()));
    let mut body = Body { buffers: buffers.collect() };
    body.visit_block(&kernel.item.block);
    for (ident, uses) in body.buffers {
        if let (Some(wait), false) = (uses.wait, uses.published_or_handed) {
            errors.push(Error::new(
                wait,
                format!(
                    "the kernel waits on `{ident}`, but no stage publishes it, so this wait never returns: publish the tiles a block wrote with `{ident}.publish(tiles)`, or pass `{ident}` to the stage function that does"
                ),
            ));
        }
    }
}
