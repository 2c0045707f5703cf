//! Test support: in-process peers the tests drive.
