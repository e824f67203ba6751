//! The index's own jemalloc arena.
//!
//! The index lives as long as its watch and grows while a list or snapshot streams events
//! through: allocated from the arena everything else uses, its vectors and tables end up in the
//! same slabs as the event path's short-lived buffers of like sizes, and each keeps a slab
//! partly empty long after those buffers are freed. In an arena of its own, its allocations
//! fill slabs of their own (docs/benchmarks.md, "Where the bytes per watched object go").
//!
//! Allocations here skip the thread cache: the index allocates only as a bucket grows or is
//! fitted, and a thread cache would hand its regions back to the shared arena's bins.
//! Without jemalloc, or if the arena cannot be made, the global allocator serves instead.
//!
//! The crate's second exception to `unsafe_code = "deny"` (after the Kafka producer's flush):
//! an allocator is an `unsafe` trait, and jemalloc's `mallocx` family has no safe binding.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

use allocator_api2::alloc::{AllocError, Allocator, Global};
use tikv_jemalloc_ctl::{Access as _, AsName as _};
use tikv_jemalloc_sys as jemalloc;

/// Allocates from the index's arena; see the module's documentation.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct IndexArena;

/// The arena's flags for `mallocx` and its kin, or `None` when the global allocator serves.
fn flags() -> Option<c_int> {
    static FLAGS: OnceLock<Option<c_int>> = OnceLock::new();
    *FLAGS.get_or_init(|| {
        let arena: u32 = b"arenas.create\0".name().read().ok()?;
        Some(jemalloc::MALLOCX_ARENA(arena as usize) | jemalloc::MALLOCX_TCACHE_NONE)
    })
}

/// The flags of one allocation: the arena's, and its alignment if larger than `malloc`'s.
fn with_alignment(flags: c_int, layout: Layout) -> c_int {
    if layout.align() <= 16 {
        flags
    } else {
        flags | jemalloc::MALLOCX_ALIGN(layout.align())
    }
}

fn slice(ptr: *mut c_void, size: usize) -> Result<NonNull<[u8]>, AllocError> {
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(AllocError)?;
    Ok(NonNull::slice_from_raw_parts(ptr, size))
}

/// A zero-sized allocation: a dangling pointer of the alignment asked, as the global allocator
/// gives (jemalloc's `mallocx` takes no size of zero).
fn empty(layout: Layout) -> NonNull<[u8]> {
    // SAFETY: an alignment is never zero.
    let ptr = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
    NonNull::slice_from_raw_parts(ptr, 0)
}

// SAFETY: every block comes from `mallocx` or `rallocx` with the arena's flags and the
// layout's alignment, and is given back with `sdallocx` and the same size and flags; blocks
// of size zero are never passed to jemalloc. When the arena could not be made, every call
// goes to the global allocator instead, for the whole run (`flags` is decided once).
unsafe impl Allocator for IndexArena {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let Some(flags) = flags() else {
            return Global.allocate(layout);
        };
        if layout.size() == 0 {
            return Ok(empty(layout));
        }
        // SAFETY: a size above zero, flags naming an arena that exists.
        slice(
            unsafe { jemalloc::mallocx(layout.size(), with_alignment(flags, layout)) },
            layout.size(),
        )
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let Some(flags) = flags() else {
            // SAFETY: the caller's promise, passed on: `ptr` came from `Global` with `layout`.
            return unsafe { Global.deallocate(ptr, layout) };
        };
        if layout.size() != 0 {
            // SAFETY: `ptr` came from `mallocx` or `rallocx` with this size and these flags.
            unsafe {
                jemalloc::sdallocx(
                    ptr.as_ptr().cast(),
                    layout.size(),
                    with_alignment(flags, layout),
                )
            }
        }
    }

    /// Grows a block with `rallocx`: in place where jemalloc can, always within the arena.
    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let flags = match flags() {
            Some(flags) if old.size() != 0 && old.align() == new.align() => flags,
            // The rare cases, through a fresh block: from nothing, or to a new alignment.
            // SAFETY: the caller's promise, passed on.
            _ => return unsafe { self.moved(ptr, old, new) },
        };
        // SAFETY: `ptr` is a live block of this arena (the caller's promise), and the new
        // size is above zero (at least the old one).
        let moved = unsafe {
            jemalloc::rallocx(ptr.as_ptr().cast(), new.size(), with_alignment(flags, new))
        };
        slice(moved, new.size())
    }

    // `shrink` keeps its default (a new block, the contents copied): the index shrinks a
    // bucket only when a list ends or half of it is removed, and jemalloc moves a small block
    // to its smaller size class by copying too.
}

impl IndexArena {
    /// A new block for `new`, the contents copied over, the old block given back.
    ///
    /// # Safety
    /// `ptr` was allocated here with `old`.
    unsafe fn moved(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let block = self.allocate(new)?;
        // SAFETY: both blocks are live and distinct, each at least this long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                block.cast::<u8>().as_ptr(),
                old.size().min(new.size()),
            );
            self.deallocate(ptr, old);
        }
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use allocator_api2::vec::Vec;

    use super::*;

    /// The arena used by an allocation, as jemalloc reports it.
    fn arena_of(ptr: *const u8) -> u32 {
        let mut arena: u32 = 0;
        let mut len = size_of::<u32>();
        let mut ptr = ptr;
        // SAFETY: `arenas.lookup` reads a pointer and writes an `unsigned`, as documented.
        let rc = unsafe {
            jemalloc::mallctl(
                c"arenas.lookup".as_ptr(),
                (&raw mut arena).cast(),
                &mut len,
                (&raw mut ptr).cast(),
                size_of::<*const u8>(),
            )
        };
        assert_eq!(rc, 0, "arenas.lookup");
        arena
    }

    #[test]
    fn the_index_allocates_from_an_arena_of_its_own() {
        let mut ours: Vec<u64, IndexArena> = Vec::new_in(IndexArena);
        ours.push(1);
        let theirs = Box::new(1u64);
        assert!(flags().is_some(), "jemalloc made the arena");
        assert_ne!(
            arena_of(ours.as_ptr().cast()),
            arena_of((&raw const *theirs).cast())
        );
    }

    #[test]
    fn blocks_grow_shrink_and_keep_their_contents() {
        let mut v: Vec<u64, IndexArena> = Vec::new_in(IndexArena);
        for n in 0..10_000u64 {
            v.push(n);
        }
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(v.capacity(), 10);
        assert!(v.iter().copied().eq(0..10));
        let first = arena_of(v.as_ptr().cast());
        v.reserve_exact(100_000);
        assert_eq!(
            arena_of(v.as_ptr().cast()),
            first,
            "rallocx stays in the arena"
        );
        assert!(v.iter().copied().eq(0..10));
    }

    #[test]
    fn zero_sized_and_overaligned_layouts() {
        let layout = Layout::from_size_align(0, 64).unwrap();
        let block = IndexArena.allocate(layout).unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % 64, 0);
        unsafe { IndexArena.deallocate(block.cast(), layout) };
        let layout = Layout::from_size_align(100, 64).unwrap();
        let block = IndexArena.allocate(layout).unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % 64, 0);
        let grown = Layout::from_size_align(5000, 64).unwrap();
        let block = unsafe { IndexArena.grow(block.cast(), layout, grown) }.unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % 64, 0);
        unsafe { IndexArena.deallocate(block.cast(), grown) };
    }
}
