//! The open-file limit. Every client connection is a descriptor, and so is the upstream
//! connection it uses: 10 000 open SSE streams need over 20 000. Distributions start processes
//! with a soft limit of 1024 (systemd's default) while allowing far more (the hard limit), so
//! holdfast raises its soft limit to the hard one at start, and says so when even that is too low
//! for `limits.max_connections`.

use std::io;

/// Descriptors holdfast needs besides its connections: listeners, the admin side, logs, files.
const SPARE: u64 = 64;

/// What [`raise_open_files`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before.
    pub was: u64,
    /// The soft limit now.
    pub now: u64,
    /// What `max_connections` connections need (client and upstream side each).
    pub needed: u64,
}

impl OpenFiles {
    /// Whether the limit is below what the configured connections need.
    pub fn too_low(&self) -> bool {
        self.now < self.needed
    }
}

/// Raises the soft open-file limit to the hard limit, and reports it against what
/// `max_connections` needs.
pub fn raise_open_files(max_connections: usize) -> io::Result<OpenFiles> {
    let needed = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(SPARE);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own; no other memory is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(OpenFiles {
        was,
        now: limit.rlim_cur,
        needed,
    })
}

/// Raises the limit and logs what happened: raised (info), too low (warning), failed (warning).
pub fn raise_and_log(max_connections: usize) {
    match raise_open_files(max_connections) {
        Ok(files) => {
            if files.now != files.was {
                tracing::info!(
                    from = files.was,
                    to = files.now,
                    "raised the open-file limit to the hard limit"
                );
            }
            if files.too_low() {
                tracing::warn!(
                    limit = files.now,
                    needed = files.needed,
                    max_connections,
                    "the open-file limit is below what limits.max_connections needs (a client \
                     and an upstream descriptor each): raise the hard limit (LimitNOFILE= in \
                     systemd, --ulimit nofile= in Docker) or lower limits.max_connections"
                );
            }
        }
        Err(error) => tracing::warn!(%error, "could not read or raise the open-file limit"),
    }
}
