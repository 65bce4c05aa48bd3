//! Usage errors of `faultline` itself: a missing command is one line on stderr with exit
//! status 2, like every other usage error; asking for help still prints all of it.

mod common;
use common::faultline;

#[test]
fn a_missing_command_is_one_line_and_help_is_whole() {
    for args in [&[][..], &["--max-memory", "4G"]] {
        let out = faultline(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err, "error: no command given (one of: gemm, sites, op, train, program, campaign, merge, plan, report, diff, explore, vcd, scalesim); see `faultline --help`\n",
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    for args in [&["--help"][..], &["help"]] {
        let out = faultline(args);
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(help.contains("Usage: faultline [OPTIONS] <COMMAND>") && help.contains("--max-memory"), "{help}");
        for cmd in ["gemm", "sites", "op", "train"] {
            assert!(help.lines().any(|l| l.trim_start().starts_with(cmd)), "{args:?}: no `{cmd}` in {help}");
        }
    }
}
