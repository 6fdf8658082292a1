//! The rules a fused kernel must satisfy: its launch shape against Hopper's limits, each
//! stage against its declared scope, the shared-memory budget, the dataflow between stages,
//! and device-only Rust. Every broken rule is reported, not only the first.

use super::ast::{eval, grid_names, size_of, text, Arg, Fused, Port, Scope, Space, Stage};
use super::scan::{scan, Findings};
use crate::kernel::ast::idents;
use crate::kernel::valid::{self, Errors};
use clusterfuse_device::limits::{MAX_SHARED_MEMORY_PER_BLOCK, MAX_STATIC_SHARED_MEMORY, MAX_THREADS_PER_BLOCK, WARP_SIZE};
use proc_macro2::Span;
use quote::ToTokens;
use std::collections::{HashMap, HashSet};
use syn::{Error, Expr, Ident, Item};

pub fn check(fused: &Fused) -> syn::Result<()> {
    let mut errors = Errors::default();
    launch_shape(fused, &mut errors);
    for stage in &fused.stages {
        self::stage(fused, stage, &mut errors);
    }
    for item in &fused.items {
        if let Item::Fn(f) = item {
            device_rust(&scan(&f.block), &mut errors);
            reserved(&f.sig.ident, &mut errors);
        }
    }
    for port in &fused.entry.params {
        if let Some(why) = port.invalid {
            errors.push(Error::new_spanned(&port.written, why));
        }
    }
    shared_budget(fused, &mut errors);
    dataflow(fused, &mut errors);
    errors.finish()
}

/// Names the generated launcher takes in the module.
fn reserved(name: &Ident, errors: &mut Errors) {
    if name == "load" || name == "config" {
        errors.push(Error::new_spanned(name, format!("`{name}` is the name of the generated launcher's `{name}(..)`; rename this function")));
    }
}

fn launch_shape(fused: &Fused, errors: &mut Errors) {
    match (fused.block.value, &fused.launch_bounds) {
        (Some(block), bounds) => {
            if block.value == 0 || block.value > MAX_THREADS_PER_BLOCK {
                errors.push(Error::new(block.span, format!("`block = {}` is out of range: a block has 1 to {MAX_THREADS_PER_BLOCK} threads", block.value)));
            }
            if let Some(bounds) = bounds {
                valid::launch_bounds(bounds, errors);
                let max = bounds.max_threads;
                if max.value < block.value {
                    errors.push(Error::new(
                        max.span,
                        format!(
                            "`max_threads = {}` is smaller than the declared `block = {}`: the launch would fail; raise it to at least {} or drop `launch_bounds` (it defaults to the block)",
                            max.value, block.value, block.value
                        ),
                    ));
                }
            }
        }
        (None, Some(bounds)) => valid::launch_bounds(bounds, errors),
        (None, None) => errors.push(Error::new_spanned(
            &fused.block.expr,
            format!(
                "`block = {}` is only known at launch; add `launch_bounds(max_threads = N)` with the largest block it can be",
                fused.block.expr.to_token_stream()
            ),
        )),
    }
    for (what, expr) in [("grid", &fused.grid), ("block", &fused.block.expr)] {
        for ident in grid_names(expr) {
            let is_u32 = fused.entry.params.iter().any(|p| p.ident == ident && p.space == Space::Uniform && text(&p.ty) == "u32");
            if !is_u32 && !fused.consts.contains_key(&ident.to_string()) {
                errors.push(Error::new_spanned(
                    &ident,
                    format!("`{what}` names `{ident}`, which is neither a `u32` parameter of `kernel` nor a `const` of this module"),
                ));
            }
        }
    }
    let Some(cluster) = &fused.cluster else { return };
    valid::cluster(cluster, errors);
    let size = cluster.size();
    if size == 0 {
        return;
    }
    // `config()` launches a one-dimensional grid, which only an x-cluster divides.
    if cluster.dims[1..] != [1, 1] {
        let [x, y, z] = cluster.dims;
        errors.push(Error::new(cluster.span, format!("cluster({x}, {y}, {z}): a fused kernel's grid is one-dimensional, so its cluster is too; write `cluster({size})`")));
        return;
    }
    let grid = fused.grid.to_token_stream().to_string();
    match eval(&fused.grid, &fused.consts) {
        Some(blocks) if !blocks.is_multiple_of(size) => errors.push(Error::new_spanned(
            &fused.grid,
            format!("cluster of {size} CTAs does not divide `grid = {grid}` ({blocks} blocks); make the grid a multiple of {size}"),
        )),
        Some(_) => {}
        None if !constant_factor(&fused.grid, &fused.consts).is_multiple_of(size) => errors.push(Error::new_spanned(
            &fused.grid,
            format!("cluster of {size} CTAs cannot be shown to divide `grid = {grid}`; declare the grid as a multiple of the cluster, e.g. `grid = {grid} * {size}`"),
        )),
        None => {}
    }
}

/// The product of the constant factors of a product, e.g. 4 for `rows * 4`.
fn constant_factor(expr: &Expr, consts: &HashMap<String, u64>) -> u64 {
    if let Some(value) = eval(expr, consts) {
        return value;
    }
    match expr {
        Expr::Paren(p) => constant_factor(&p.expr, consts),
        Expr::Binary(b) if matches!(b.op, syn::BinOp::Mul(_)) => constant_factor(&b.left, consts) * constant_factor(&b.right, consts),
        _ => 1,
    }
}

fn stage(fused: &Fused, stage: &Stage, errors: &mut Errors) {
    let scope = stage.scope;
    let name = stage.name();
    reserved(name, errors);
    match scope.value {
        Scope::Grid => errors.push(Error::new(
            scope.span,
            format!("`#[stage(grid)]` would wait for every block of the grid: a dependence across clusters, which one fused kernel cannot order (blocks are not all resident); end the fused kernel before `{name}` and launch it as a second kernel"),
        )),
        Scope::Cluster if fused.cluster.is_none() => errors.push(Error::new(
            scope.span,
            format!("`#[stage(cluster)]` stage `{name}` needs a cluster launch; add `cluster(N)` to `#[fused_kernel(..)]` or declare the stage `#[stage(block)]`"),
        )),
        Scope::Warp if fused.block.value.is_some_and(|b| !b.value.is_multiple_of(WARP_SIZE)) => errors.push(Error::new(
            scope.span,
            format!(
                "`#[stage(warp)]` stage `{name}` needs whole warps, but `block = {}` is not a multiple of {WARP_SIZE}; use a block of {}",
                fused.block.expr.to_token_stream(),
                fused.block.value.map_or(0, |b| b.value.next_multiple_of(WARP_SIZE))
            ),
        )),
        _ => {}
    }
    for port in stage.inputs.iter().chain(&stage.outputs) {
        if let Some(why) = port.invalid {
            errors.push(Error::new_spanned(&port.written, why));
        } else if port.space == Space::Dsmem && fused.cluster.is_none() {
            errors.push(Error::new_spanned(
                &port.written,
                "`Dsmem<..>` is shared memory of the cluster's other blocks, and this kernel has no cluster; add `cluster(N)` to `#[fused_kernel(..)]` or use `Shared<..>`",
            ));
        }
    }
    let findings = scan(&stage.item.block);
    device_rust(&findings, errors);
    let partial_warp = fused.block.value.filter(|b| !b.value.is_multiple_of(WARP_SIZE));
    for collective in &findings.collectives {
        let what = &collective.what;
        // Warp collectives, and the block's reductions built on them, shuffle with the full mask.
        let whole_warps = collective.scope == Scope::Warp || (collective.scope == Scope::Block && what.contains("reduce"));
        if let Some(block) = partial_warp.filter(|_| whole_warps && scope.value != Scope::Warp) {
            errors.push(Error::new(
                collective.span,
                format!(
                    "`{what}` runs on whole warps, but `block = {}` is not a multiple of {WARP_SIZE}; use a block of {}",
                    fused.block.expr.to_token_stream(),
                    block.value.next_multiple_of(WARP_SIZE)
                ),
            ));
        }
        if collective.scope == Scope::Cluster && fused.cluster.is_none() {
            let access = if collective.dsmem { "a DSMEM access" } else { "a cluster collective" };
            errors.push(Error::new(
                collective.span,
                format!("`{what}` is {access}, but this kernel has no cluster; add `cluster(N)` to `#[fused_kernel(..)]`"),
            ));
        } else if !collective.dsmem && collective.scope > scope.value && scope.value != Scope::Grid {
            errors.push(Error::new(
                collective.span,
                format!(
                    "`{what}` synchronises the whole {}, but stage `{name}` is declared `#[stage({})]`; declare it `#[stage({})]` so the fusion plan knows",
                    collective.scope.name(),
                    scope.value.name(),
                    collective.scope.name()
                ),
            ));
        }
    }
}

fn device_rust(findings: &Findings, errors: &mut Errors) {
    for (span, message) in &findings.unsupported {
        errors.push(Error::new(*span, message));
    }
}

/// Static shared memory (`#[out]` arrays, one per call of their stage, and `shared!` scratch,
/// one per site) by stage against ptxas's limit for static memory, and with the declared
/// dynamic shared memory against the per-block limit.
fn shared_budget(fused: &Fused, errors: &mut Errors) {
    let mut parts: Vec<(String, u64, Span)> = Vec::new();
    let unsized_error = |ty: &dyn ToTokens| {
        Error::new_spanned(ty, "cannot size this shared array: write `[T; N]` with a primitive `T` and `N` an integer literal or a `const` of this module")
    };
    let mut add = |owner: String, blocks: &syn::Block, outputs: &[Port], calls: u64, errors: &mut Errors| {
        let mut bytes = 0;
        let mut what = Vec::new();
        let mut span = None;
        for port in outputs.iter().filter(|p| p.space.is_shared() && p.invalid.is_none()) {
            match size_of(&port.ty, &fused.consts) {
                Some(b) => {
                    bytes += b * calls;
                    what.push(if calls > 1 { format!("`{}` {b} B × {calls} calls", port.ident) } else { format!("`{}` {b} B", port.ident) });
                    span.get_or_insert(syn::spanned::Spanned::span(&port.written));
                }
                None => errors.push(unsized_error(&port.written)),
            }
        }
        for array in scan(blocks).scratch {
            match size_of(&syn::Type::Array(array.clone()), &fused.consts) {
                Some(b) => {
                    bytes += b;
                    what.push(format!("scratch `{}` {b} B", array.to_token_stream().to_string().replace(' ', "")));
                    span.get_or_insert(syn::spanned::Spanned::span(&array));
                }
                None => errors.push(unsized_error(&array)),
            }
        }
        if bytes > 0 {
            parts.push((format!("{owner} {bytes} B ({})", what.join(", ")), bytes, span.expect("set with bytes")));
        }
    };
    for stage in &fused.stages {
        let calls = fused.entry.steps.iter().filter(|s| s.stage == stage.item.sig.ident).count().max(1) as u64;
        add(format!("stage `{}`", stage.name()), &stage.item.block, &stage.outputs, calls, errors);
    }
    for item in &fused.items {
        if let Item::Fn(f) = item {
            add(format!("fn `{}`", f.sig.ident), &f.block, &[], 1, errors);
        }
    }
    let breakdown = |parts: &[(String, u64, Span)]| parts.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join("; ");
    let largest = |parts: &[(String, u64, Span)]| parts.iter().max_by_key(|p| p.1).expect("over a limit, so not empty").2;
    let static_bytes: u64 = parts.iter().map(|p| p.1).sum();
    if static_bytes > MAX_STATIC_SHARED_MEMORY as u64 {
        let message = format!(
            "static shared memory per block is {static_bytes} B, over the {MAX_STATIC_SHARED_MEMORY} B (48 KB) ptxas allows `.shared` arrays: {}; shrink the largest, or keep the data in registers",
            breakdown(&parts)
        );
        errors.push(Error::new(largest(&parts), message));
        return;
    }
    if let Some(dynamic) = fused.dynamic_smem {
        parts.push((format!("dynamic_smem {} B", dynamic.value), dynamic.value as u64, dynamic.span));
    }
    let total: u64 = parts.iter().map(|p| p.1).sum();
    let limit = MAX_SHARED_MEMORY_PER_BLOCK as u64;
    if total > limit {
        let message = format!("shared memory per block is {total} B, over Hopper's limit of {limit} B (227 KB): {}; shrink the largest or keep the data in registers", breakdown(&parts));
        errors.push(Error::new(largest(&parts), message));
    }
}

/// A value flowing through the entry: a parameter or a stage's output.
struct Value<'a> {
    port: &'a Port,
    /// The stage that produced it; `None` for a kernel parameter.
    producer: Option<&'a Stage>,
    consumed: bool,
    /// For a kernel output: the stage that writes it.
    written_by: Option<&'a Ident>,
}

fn dataflow(fused: &Fused, errors: &mut Errors) {
    let entry = &fused.entry;
    for stray in &entry.strays {
        errors.push(Error::new_spanned(
            stray,
            "the body of `kernel` is the stages' dataflow: only `let out = stage(a, b);` and `stage(a, b);`; move this code into a stage",
        ));
    }
    let mut values: HashMap<String, Value> = entry
        .params
        .iter()
        .map(|port| (port.ident.to_string(), Value { port, producer: None, consumed: false, written_by: None }))
        .collect();
    let bound_at: HashMap<String, (usize, &Ident)> =
        entry.steps.iter().enumerate().flat_map(|(i, step)| step.binds.iter().map(move |b| (b.to_string(), (i, &step.stage)))).collect();
    // Names bound by a statement that already has an error, and names used before their
    // statement: later errors about them would only repeat the first.
    let (mut failed, mut used_early) = (HashSet::new(), HashSet::new());
    for step in &entry.steps {
        let Some(stage) = fused.stage(&step.stage) else {
            failed.extend(step.binds.iter().map(Ident::to_string));
            let known: Vec<String> = fused.stages.iter().map(|s| format!("`{}`", s.name())).collect();
            errors.push(Error::new_spanned(
                &step.stage,
                format!("`{}` is not a stage of this module; mark it `#[stage(scope)]` or call one of {}", step.stage, known.join(", ")),
            ));
            continue;
        };
        if step.args.len() != stage.inputs.len() {
            let names: Vec<String> = stage.inputs.iter().map(|p| p.ident.to_string()).collect();
            errors.push(Error::new(
                step.span,
                format!("stage `{}` takes {} inputs ({}) but is given {}", stage.name(), names.len(), names.join(", "), step.args.len()),
            ));
        }
        for (arg, port) in step.args.iter().zip(&stage.inputs) {
            let name = match arg {
                Arg::Name(name) => name,
                Arg::Other(expr) => {
                    errors.push(Error::new_spanned(expr, "pass values by name: a stage's arguments are parameters of `kernel` or earlier stages' outputs"));
                    // The values it names are used, if not as this stage can take them: one
                    // error, not a second that calls them never consumed.
                    for ident in idents(expr.to_token_stream()) {
                        if let Some(value) = values.get_mut(&ident.to_string()) {
                            value.consumed = true;
                        }
                    }
                    continue;
                }
            };
            let Some(value) = values.get_mut(&name.to_string()) else {
                if failed.contains(&name.to_string()) {
                    continue;
                }
                used_early.insert(name.to_string());
                let message = match bound_at.get(&name.to_string()) {
                    Some((_, producer)) => format!("`{name}` is used before stage `{producer}` produces it; call `{producer}` before `{}`", stage.name()),
                    None => format!("`{name}` is neither a parameter of `kernel` nor the output of an earlier stage"),
                };
                errors.push(Error::new_spanned(name, message));
                continue;
            };
            value.consumed = true;
            if port.invalid.is_some() || value.port.invalid.is_some() {
                continue;
            }
            if let Some(writer) = value.written_by {
                errors.push(Error::new_spanned(
                    name,
                    format!(
                        "`{name}` is written to global memory by stage `{writer}`, and stage `{}` touches it again: that depends on other clusters' writes, a grid-wide dependence that one fused kernel cannot order; keep the value in `Registers`/`Shared` between the stages, or end the fused kernel after `{writer}`",
                        stage.name()
                    ),
                ));
                continue;
            }
            if port.space == Space::GlobalOut {
                value.written_by = Some(stage.name());
            }
            let producer = value.producer.map(|s| format!(" from stage `{}`", s.name())).unwrap_or_default();
            let compatible = value.port.space == port.space || (value.port.space.is_shared() && port.space.is_shared());
            if !compatible {
                errors.push(Error::new_spanned(
                    name,
                    format!(
                        "memory-space mismatch: `{name}` is {}{producer}, but stage `{}` takes `{}` as {}; make the two declarations agree",
                        value.port.space.name(),
                        stage.name(),
                        port.ident,
                        port.space.name()
                    ),
                ));
                continue;
            }
            if let Some(message) = type_mismatch(fused, value.port, port) {
                errors.push(Error::new_spanned(
                    name,
                    format!("{message}: `{name}`{producer} is `{}`, but stage `{}` takes `{}: {}`", text(&value.port.written), stage.name(), port.ident, text(&port.written)),
                ));
                continue;
            }
        }
        if step.binds.len() != stage.outputs.len() {
            let names: Vec<String> = stage.outputs.iter().filter(|p| !p.ident.to_string().starts_with('_')).map(|p| format!("`{}`", p.ident)).collect();
            let names = if names.is_empty() { String::new() } else { format!(" ({} and what it returns)", names.join(", ")) };
            let outputs = match stage.outputs.len() {
                1 => "1 output".to_string(),
                n => format!("{n} outputs"),
            };
            errors.push(Error::new(
                step.span,
                format!("stage `{}` has {outputs}{names} but the statement binds {}; bind each with `let (a, b) = ...`", stage.name(), step.binds.len()),
            ));
            failed.extend(step.binds.iter().map(Ident::to_string));
            continue;
        }
        for (bind, port) in step.binds.iter().zip(&stage.outputs) {
            if values.contains_key(&bind.to_string()) {
                errors.push(Error::new_spanned(bind, format!("`{bind}` is already bound; give this output its own name")));
                continue;
            }
            let consumed = used_early.contains(&bind.to_string());
            values.insert(bind.to_string(), Value { port, producer: Some(stage), consumed, written_by: None });
        }
    }
    for step in &entry.steps {
        for bind in &step.binds {
            let Some(value) = values.get(&bind.to_string()) else { continue };
            if let (false, Some(stage)) = (value.consumed, value.producer) {
                errors.push(Error::new_spanned(
                    bind,
                    format!("`{bind}`, produced by stage `{}`, is never consumed; pass it to a later stage or remove that output from `{}`", stage.name(), stage.name()),
                ));
            }
        }
    }
    for port in entry.params.iter().filter(|p| p.space == Space::GlobalOut) {
        if values[&port.ident.to_string()].written_by.is_none() && !values[&port.ident.to_string()].consumed {
            errors.push(Error::new_spanned(
                &port.ident,
                format!("output `{}` is never written; pass it to a stage that takes a `Global<Out<T>>`", port.ident),
            ));
        }
    }
}

/// Why a value of `have` cannot feed `want`: a shape (array length) or a type mismatch.
fn type_mismatch(fused: &Fused, have: &Port, want: &Port) -> Option<&'static str> {
    if let (syn::Type::Array(a), syn::Type::Array(b)) = (&have.ty, &want.ty) {
        if text(&a.elem) != text(&b.elem) {
            return Some("element type mismatch");
        }
        return match (eval(&a.len, &fused.consts), eval(&b.len, &fused.consts)) {
            (Some(x), Some(y)) if x != y => Some("shape mismatch"),
            (Some(_), Some(_)) => None,
            _ if text(&have.ty) != text(&want.ty) => Some("shape mismatch"),
            _ => None,
        };
    }
    (text(&have.ty) != text(&want.ty)).then_some("type mismatch")
}
