//! tauri.conf.json lives at the repository root (DESIGN.md's layout), and tauri-build reads the
//! config from its working directory: run it from there, with the capabilities kept here.
fn main() {
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("src-tauri sits in the repository root");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("tauri.conf.json").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("capabilities").display()
    );
    std::env::set_current_dir(root).expect("the repository root is readable");
    tauri_build::try_build(
        tauri_build::Attributes::new().capabilities_path_pattern("./src-tauri/capabilities/**/*"),
    )
    .expect("tauri-build");
}
