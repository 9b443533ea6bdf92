//! tauri.conf.json sits beside the root Cargo.toml (the app is the root package); the
//! capabilities stay with the shell's code in src-tauri/.
fn main() {
    tauri_build::try_build(
        tauri_build::Attributes::new().capabilities_path_pattern("./src-tauri/capabilities/**/*"),
    )
    .expect("tauri-build");
}
