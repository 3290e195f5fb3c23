//! End-to-end tests of areal-rs live in `tests/`; this library is empty on purpose.
