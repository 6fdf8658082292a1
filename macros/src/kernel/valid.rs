//! Rules a `#[kernel]` must satisfy, checked against Hopper's limits. Every broken rule is
//! reported, not only the first.

use super::ast::{Cluster, Kernel, LaunchBounds, ParamKind};
use clusterfuse_device::limits::{MAX_BLOCKS_PER_SM, MAX_CLUSTER_SIZE, MAX_PORTABLE_CLUSTER_SIZE, MAX_THREADS_PER_BLOCK};
use syn::Error;

/// Every broken rule, combined into one `syn::Error` (serde's `Ctxt`).
#[derive(Default)]
pub(crate) struct Errors(Option<Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: Error) {
        match &mut self.0 {
            Some(first) => first.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

pub fn check(kernel: &Kernel) -> syn::Result<()> {
    let mut errors = Errors::default();
    check_signature(kernel, &mut errors);
    check_launch_bounds(kernel, &mut errors);
    check_cluster(kernel, &mut errors);
    super::handoffs::check(kernel, &mut errors);
    errors.finish()
}

fn check_signature(kernel: &Kernel, errors: &mut Errors) {
    let sig = &kernel.item.sig;
    if !sig.generics.params.is_empty() {
        errors.push(Error::new_spanned(&sig.generics, "a kernel cannot be generic: PTX entries are monomorphic; write one kernel per type (a macro_rules! can stamp them out)"));
    }
    if let Some(asyncness) = &sig.asyncness {
        errors.push(Error::new_spanned(asyncness, "a kernel cannot be `async`"));
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.push(Error::new_spanned(unsafety, "a kernel cannot be `unsafe fn`; use `unsafe` blocks inside it"));
    }
    if let Some(constness) = &sig.constness {
        errors.push(Error::new_spanned(constness, "a kernel cannot be `const`"));
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        errors.push(Error::new_spanned(ty, "a kernel returns nothing; write results to an `Out<T>` parameter"));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(Error::new_spanned(variadic, "a kernel cannot be variadic"));
    }
    for param in &kernel.params {
        match param.kind {
            ParamKind::Unsupported(why) => errors.push(Error::new_spanned(&param.ty, why)),
            ParamKind::Published(_) if kernel.persistent.is_none() => errors.push(Error::new_spanned(
                &param.ty,
                format!(
                    "`{}` is a `Published` buffer, which blocks wait on each other through, so the kernel must be persistent: write `#[kernel(persistent, ..)]` (its launch then checks that the whole grid is resident at once)",
                    param.ident
                ),
            )),
            _ => {}
        }
    }
}

fn check_launch_bounds(kernel: &Kernel, errors: &mut Errors) {
    if let Some(bounds) = &kernel.launch_bounds {
        launch_bounds(bounds, errors);
    }
}

pub(crate) fn launch_bounds(bounds: &LaunchBounds, errors: &mut Errors) {
    let max = bounds.max_threads;
    if max.value == 0 || max.value > MAX_THREADS_PER_BLOCK {
        errors.push(Error::new(
            max.span,
            format!("`max_threads = {}` is out of range: a block has 1 to {MAX_THREADS_PER_BLOCK} threads", max.value),
        ));
    }
    if let Some(min) = bounds.min_blocks {
        if min.value == 0 || min.value > MAX_BLOCKS_PER_SM {
            errors.push(Error::new(
                min.span,
                format!("`min_blocks = {}` is out of range: a multiprocessor holds 1 to {MAX_BLOCKS_PER_SM} blocks", min.value),
            ));
        } else if max.value as u64 * min.value as u64 > 2048 {
            errors.push(Error::new(
                min.span,
                format!(
                    "`min_blocks = {}` of {} threads needs {} threads per multiprocessor, more than Hopper's 2048; lower `min_blocks` or `max_threads`",
                    min.value,
                    max.value,
                    max.value as u64 * min.value as u64
                ),
            ));
        }
    }
}

fn check_cluster(kernel: &Kernel, errors: &mut Errors) {
    if let Some(cluster) = &kernel.cluster {
        self::cluster(cluster, errors);
    }
}

pub(crate) fn cluster(cluster: &Cluster, errors: &mut Errors) {
    let [x, y, z] = cluster.dims;
    if cluster.dims.contains(&0) {
        errors.push(Error::new(cluster.span, format!("cluster extent ({x}, {y}, {z}) has a zero; every extent is at least 1")));
        return;
    }
    let size = cluster.size();
    if size > MAX_CLUSTER_SIZE as u64 {
        errors.push(Error::new(
            cluster.span,
            format!("cluster of {size} CTAs exceeds Hopper's maximum of {MAX_CLUSTER_SIZE}; use a smaller cluster"),
        ));
    } else if size > MAX_PORTABLE_CLUSTER_SIZE as u64 && !cluster.non_portable {
        errors.push(Error::new(
            cluster.span,
            format!(
                "cluster of {size} CTAs exceeds the portable maximum of {MAX_PORTABLE_CLUSTER_SIZE}; use `cluster({x}, {y}, {z}, non_portable)` or a smaller cluster"
            ),
        ));
    }
}
