//! Generates the gRPC code from `proto/` with the protoc that ships inside
//! the `protoc-bin-vendored` crate (nothing is downloaded or installed),
//! and the file descriptor set that server reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("oncekv.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .compile_with_config(
            config,
            &["proto/oncekv/v1/kv.proto", "proto/oncekv/v1/raft.proto"],
            &["proto"],
        )?;
    Ok(())
}
