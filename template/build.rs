// Compiles this crate's kernels to PTX (for nvptx64, then checked by ptxas) into
// $OUT_DIR/clusterfuse.ptx, which `clusterfuse::embed_ptx!()` embeds.
fn main() -> Result<(), clusterfuse_build::Error> {
    clusterfuse_build::build_kernels()
}
