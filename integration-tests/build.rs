//! Sets `cfg(browser_missing)` when Chromium or chromedriver is not installed, so the browser
//! tests are reported as ignored with the reason instead of passing silently. Never under
//! `CI=true`: there the tests run and fail when the browser is missing.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(browser_missing)");
    println!("cargo::rerun-if-env-changed=CI");
    let mut missing = false;
    for (var, default) in [
        ("TESSERA_CHROMIUM", "/usr/bin/chromium"),
        ("TESSERA_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ] {
        println!("cargo::rerun-if-env-changed={var}");
        let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
        // Watch the folder: installing the browser changes it, even when the file was absent.
        if let Some(dir) = path.parent() {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        missing |= !path.is_file();
    }
    if missing && std::env::var("CI").as_deref() != Ok("true") {
        println!("cargo::rustc-cfg=browser_missing");
    }
}
