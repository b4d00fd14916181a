//! Pinning a thread to one core, for the two-thread rows (the `threads`
//! module): a one-thread run on each of two cores, and a two-thread run
//! with one thread on each, so that cores of unequal speed (virtual
//! machines' often are) show as two one-thread figures instead of moving
//! the scaling with whichever core a one-thread run happened to get.

/// The first two cores this process may run on, when it may run on two
/// and a thread can be pinned here (Linux); `None` otherwise.
pub fn two() -> Option<[usize; 2]> {
    match imp::allowed()[..] {
        [a, b, ..] => Some([a, b]),
        _ => None,
    }
}

/// Pins the calling thread to `core`; whether that worked.
pub fn pin(core: usize) -> bool {
    imp::pin(core)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::mem::{size_of, zeroed};

    /// The cores in the calling thread's affinity mask (the process's, on
    /// a thread nothing has pinned), in order.
    pub fn allowed() -> Vec<usize> {
        // SAFETY: an all-zero `cpu_set_t` is an empty set, and
        // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes
        // into the one it is given.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&core| unsafe { libc::CPU_ISSET(core, &set) })
            .collect()
    }

    pub fn pin(core: usize) -> bool {
        // SAFETY: as in `allowed`; `CPU_SET` writes within the set for a
        // core below `CPU_SETSIZE`, which `allowed` only returns.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        if core >= libc::CPU_SETSIZE as usize {
            return false;
        }
        unsafe { libc::CPU_SET(core, &mut set) };
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0 }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub fn allowed() -> Vec<usize> {
        Vec::new()
    }

    pub fn pin(_core: usize) -> bool {
        false
    }
}
