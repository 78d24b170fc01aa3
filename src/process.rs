//! Settings that hold for the whole process, applied by the binary (and the
//! benches that stand for it) before any work starts.

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`).
///
/// Why: the allocator (mimalloc) asks the kernel for huge pages on its
/// arenas, and the pipeline frees and allocates batch-sized buffers all the
/// time. Each arena page the allocator purges and touches again is faulted
/// back as a fresh 2 MiB page that the kernel zeroes whole, however little
/// of it is used: `perf record -g reconciler run` over a preloaded
/// 100,000-operation topic showed 15–29 % of the process's samples in the
/// kernel's `clear_page_erms` under `do_huge_pmd_anonymous_page`, called
/// from mimalloc's fresh-page path. With huge pages off that run took
/// about a fifth less CPU and a lower peak RSS; on a longer run, once the
/// heap stopped growing, the CPU did not move (BENCHMARKS.md, "Defaults
/// chosen by measurement").
///
/// The flag is the process's, not the machine's: other programs keep their
/// setting. It also covers the kernel's `always` mode, where pages become
/// huge without being asked for, and it is inherited by child processes.
/// Failure (a kernel without the call) leaves the default and is returned
/// for the caller to log.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with PR_SET_THP_DISABLE takes plain integers and
        // touches no memory of ours. The arguments go as unsigned longs, as
        // the kernel reads them (it refuses non-zero unused ones).
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_THP_DISABLE,
                1 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The flag reads back as set once the call returned.
    #[test]
    fn huge_pages_are_off_after_the_call() {
        super::disable_transparent_huge_pages().unwrap();
        // SAFETY: as above, integers only.
        let flag = unsafe {
            libc::prctl(
                libc::PR_GET_THP_DISABLE,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        assert_eq!(flag, 1);
    }
}
