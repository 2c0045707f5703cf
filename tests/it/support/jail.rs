//! Configuration tests that read the environment run in figment's `Jail`: jails take one
//! process-wide lock, restore the variables they set, and switch the current directory to a fresh
//! temporary one.

use figment::Jail;
use holdfast::config;

/// What a jailed test returns: figment's error, boxed because it is large.
pub type Jailed = Result<(), Box<figment::Error>>;

/// Runs `f` in a jail where no `HOLDFAST_*` variable is set.
#[allow(clippy::result_large_err)] // Jail's closure must return figment's own Result.
pub fn jailed(f: impl FnOnce(&mut Jail) -> Jailed) {
    Jail::expect_with(|jail| {
        // A HOLDFAST_* variable in the shell that runs the tests would be read as a key. A jail
        // can only clear the whole environment, so it does that only when there is one.
        let stray = std::env::vars_os().any(|(k, _)| {
            k.to_string_lossy()
                .to_ascii_uppercase()
                .starts_with(config::ENV_PREFIX)
        });
        if stray {
            jail.clear_env();
        }
        f(jail).map_err(|e| *e)
    });
}
