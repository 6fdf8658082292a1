//! What a fused kernel's function bodies do that the checks care about: Rust the device
//! cannot run, collectives (with the scope they synchronise), DSMEM accesses, and the
//! `shared!` scratch arrays they allocate.

use super::ast::Scope;
use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Expr, Token, TypeArray};

#[derive(Default)]
pub struct Findings {
    /// Constructs that cannot run on the device, with the message that names them.
    pub unsupported: Vec<(Span, String)>,
    /// Calls that synchronise a scope (`block::sync`, `warp::reduce_sum`, `cluster::reduce`)
    /// and DSMEM accesses (`.in_block(rank)`), which need a cluster but synchronise nothing.
    pub collectives: Vec<Collective>,
    /// `shared!([T; N])` arrays.
    pub scratch: Vec<TypeArray>,
}

pub struct Collective {
    pub scope: Scope,
    pub what: String,
    pub span: Span,
    pub dsmem: bool,
}

pub fn scan(block: &syn::Block) -> Findings {
    let mut findings = Findings::default();
    findings.visit_block(block);
    findings
}

const HEAP: &[&str] = &["Vec", "Box", "Rc", "Arc", "HashMap", "HashSet", "BTreeMap", "BTreeSet", "VecDeque", "BinaryHeap"];

fn collective_scope(module: &str, function: &str) -> Option<Scope> {
    let scope = match module {
        "warp" => Scope::Warp,
        "block" => Scope::Block,
        "cluster" => Scope::Cluster,
        _ => return None,
    };
    let collective = match scope {
        Scope::Warp => ["sync", "shuffle_xor", "shuffle_down", "shuffle_up", "broadcast", "ballot", "all", "any", "reduce", "reduce_sum", "reduce_max"].contains(&function),
        Scope::Block => ["sync", "reduce", "reduce_sum", "reduce_max"].contains(&function),
        _ => ["sync", "arrive", "wait", "reduce", "gather", "broadcast"].contains(&function),
    };
    collective.then_some(scope)
}

impl Findings {
    fn unsupported(&mut self, span: Span, message: String) {
        self.unsupported.push((span, message));
    }
}

/// True when a panic-family macro's message is formatted (has arguments or `{..}`), given
/// the index of its message among the macro's arguments.
fn formatted(mac: &syn::Macro, message_index: usize) -> bool {
    let Ok(args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) else { return true };
    let args: Vec<&Expr> = args.iter().collect();
    match args.get(message_index) {
        None => false,
        Some(Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) => args.len() > message_index + 1 || s.value().contains('{'),
        Some(_) => true,
    }
}

impl<'ast> Visit<'ast> for Findings {
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let Some(name) = mac.path.segments.last().map(|s| s.ident.to_string()) else { return };
        let span = mac.path.span();
        match name.as_str() {
            "format" | "format_args" | "write" | "writeln" => self.unsupported(
                span,
                format!("`{name}!` formats text with `core::fmt`, which does not run on the device; write the numbers to a `Global<Out<T>>` buffer and format them on the host"),
            ),
            "println" | "print" | "eprintln" | "eprint" | "dbg" => self.unsupported(
                span,
                format!("`{name}!` needs a console and `core::fmt`, which the device does not have; write the values to a `Global<Out<T>>` buffer and print them on the host"),
            ),
            "vec" => self.unsupported(
                span,
                "`vec!` allocates on the heap, which the device does not have; use a fixed-size array `[T; N]` (registers) or `shared!([T; N])`".into(),
            ),
            "assert_eq" | "assert_ne" | "debug_assert_eq" | "debug_assert_ne" => self.unsupported(
                span,
                format!("`{name}!` formats both sides with `Debug` (`core::fmt`) when it fails; use `assert!(a == b)`, whose message is fixed"),
            ),
            "panic" | "unreachable" | "todo" | "unimplemented" if formatted(mac, 0) => self.unsupported(
                span,
                format!("`{name}!` with a formatted message pulls `core::fmt` onto the device; use a fixed message, e.g. `{name}!(\"shape mismatch\")`"),
            ),
            "assert" | "debug_assert" if formatted(mac, 1) => self.unsupported(
                span,
                format!("`{name}!` with a formatted message pulls `core::fmt` onto the device; drop the message or make it a fixed string"),
            ),
            "shared" => {
                if let Ok(array) = mac.parse_body::<TypeArray>() {
                    self.scratch.push(array);
                }
            }
            _ => {}
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        for segment in &path.segments {
            let name = segment.ident.to_string();
            if HEAP.contains(&name.as_str()) {
                self.unsupported(
                    segment.ident.span(),
                    format!("`{name}` allocates on the heap, which the device does not have; use a fixed-size array `[T; N]` (registers) or `shared!([T; N])`"),
                );
            } else if name == "String" {
                self.unsupported(
                    segment.ident.span(),
                    "`String` allocates on the heap and the device has neither a heap nor text output; keep numbers, and write them to a `Global<Out<T>>` buffer".into(),
                );
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Expr::Path(func) = &*call.func {
            let segments: Vec<String> = func.path.segments.iter().map(|s| s.ident.to_string()).collect();
            if let [.., module, function] = segments.as_slice() {
                if let Some(scope) = collective_scope(module, function) {
                    self.collectives.push(Collective { scope, what: format!("{module}::{function}"), span: func.span(), dsmem: false });
                }
            }
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let name = call.method.to_string();
        let span = call.method.span();
        match name.as_str() {
            "to_string" | "to_owned" | "to_vec" | "into_boxed_slice" => self.unsupported(
                span,
                format!("`.{name}()` allocates on the heap, which the device does not have; keep the value in a fixed-size array or in registers"),
            ),
            "unwrap" | "expect" => self.unsupported(
                span,
                format!("`.{name}()` panics through `core::fmt` when it fails (a `Result`'s error is formatted with `Debug`); handle the failure with `match`, `if let` or `unwrap_or`"),
            ),
            "in_block" => self.collectives.push(Collective { scope: Scope::Cluster, what: ".in_block(..)".into(), span, dsmem: true }),
            _ => {}
        }
        visit::visit_expr_method_call(self, call);
    }
}
