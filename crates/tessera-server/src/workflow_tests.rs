//! `tessera test [DIR...] [--update]`: runs the workflows' test files (see `tessera-testing`)
//! and prints one line per case, with the differences of each failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_testing::{CaseOutcome, run_dir};

/// Runs every test of every workflow under `dirs` (default: the configured workflows dir).
/// Exit code 1 when a case fails or cannot run, or when no test was found.
pub fn run(dirs: &[PathBuf], configured: &Path, update: bool) -> ExitCode {
    let default = [configured.to_path_buf()];
    let dirs = if dirs.is_empty() { &default[..] } else { dirs };
    let mut out = std::io::stdout().lock();
    let (mut passed, mut failed) = (0usize, 0usize);
    for dir in dirs {
        let reports = match run_dir(dir, update) {
            Ok(reports) => reports,
            Err(e) => {
                eprintln!("error: {e}");
                failed += 1;
                continue;
            }
        };
        for report in reports {
            let name = match report.file.file_name() {
                Some(file) if report.file.is_file() => {
                    format!("{}/tests/{}", report.workflow, file.to_string_lossy())
                }
                _ => report.workflow.clone(),
            };
            let written = match &report.outcome {
                CaseOutcome::Passed => writeln!(out, "PASS     {name}"),
                CaseOutcome::Updated => writeln!(out, "UPDATED  {name}"),
                CaseOutcome::Failed(mismatches) => {
                    let mut text = format!("FAIL     {name}\n");
                    for m in mismatches {
                        text.push_str(&format!("{m}\n"));
                    }
                    write!(out, "{text}")
                }
                CaseOutcome::Error(why) => writeln!(out, "ERROR    {name}\n  {why}"),
            };
            if written.is_err() {
                return ExitCode::FAILURE;
            }
            if report.outcome.ok() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    let _ = writeln!(out, "\n{passed} passed, {failed} failed");
    if update && failed == 0 {
        let _ = writeln!(
            out,
            "expectations rewritten from this run: review them (git diff) before committing"
        );
    }
    if failed > 0 || passed == 0 {
        if passed == 0 && failed == 0 {
            eprintln!("error: no test files found (expected workflows/<Name>/tests/*.json)");
        }
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
