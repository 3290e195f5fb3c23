//! Compiles `proto/areal/v1/*.proto` with protox (in Rust: no `protoc` to install) and
//! generates the messages and the tonic clients and servers.

fn main() {
    let files = [
        "proto/areal/v1/common.proto",
        "proto/areal/v1/generator.proto",
        "proto/areal/v1/reward.proto",
        "proto/areal/v1/tool.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"]).unwrap_or_else(|e| panic!("{e:?}"));
    tonic_prost_build::configure()
        // weight parts are shared by every server's stream without copies
        .bytes(".areal.v1.TensorPart.data")
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating the gRPC code: {e}"));
}
