//! A run configuration on the testkit plugins: the whole engine in well under a second.

/// Config (TOML) that runs the engine on the testkit's bigram policy and successor task; load
/// it with `ConfigLoader::toml` and override what a test needs.
pub const CONFIG: &str = include_str!("../testkit.toml");
