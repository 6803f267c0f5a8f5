//! Generates the gRPC code from `proto/` with the protoc that ships inside
//! the `protoc-bin-vendored` crate (nothing is downloaded or installed),
//! and the file descriptor sets that server reflection serves: oncekv's
//! own services, and etcd's v3 API (`proto/etcd-api`, see its README).
//! One message is not generated: `ExecuteBatchRequest` is `src/batch.rs`'s,
//! whose decoding refuses a batch past its cap before decoding the rest.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let include = include
        .to_str()
        .ok_or("protoc's include path is not UTF-8")?;

    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        .extern_path(
            ".oncekv.v1.ExecuteBatchRequest",
            "crate::batch::ExecuteBatchRequest",
        )
        .file_descriptor_set_path(out.join("oncekv.bin"))
        .compile_with_config(
            config,
            &["proto/oncekv/v1/kv.proto", "proto/oncekv/v1/raft.proto"],
            &["proto"],
        )?;

    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    // Methods the node does not serve (yet) answer UNIMPLEMENTED, as a
    // server without them would.
    tonic_prost_build::configure()
        .generate_default_stubs(true)
        .file_descriptor_set_path(out.join("etcd.bin"))
        .compile_with_config(
            config,
            &[
                "proto/etcd-api/etcd/api/etcdserverpb/rpc.proto",
                "proto/etcd-api/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
                "proto/etcd-api/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
            ],
            &["proto/etcd-api", include],
        )?;
    Ok(())
}
