fn main() -> Result<(), clusterfuse_build::Error> {
    clusterfuse_build::build_kernels()
}
