//! Plugins' linear memories, mapped by sluice so that a used instance can
//! be put back the way it was made: the instance `reset` policy.
//!
//! Making an instance of a big component costs more than calling it: a
//! Python plugin (componentize-py, 14 core modules) takes 1.4–1.8 ms to
//! instantiate and 0.03 ms to run. So an instance is made once, warmed up,
//! and its memories are then *frozen* ([`Frozen::freeze`]): each memory's
//! contents go into a memfd, which is mapped copy-on-write over the memory
//! itself. A call's writes land in private copies of the pages it touches;
//! after the call, [`Frozen::thaw`] finds those pages with Linux's
//! `PAGEMAP_SCAN` and drops them (`MADV_DONTNEED`), so the memory reads as
//! the frozen image again — every byte any call wrote is gone, and the
//! work is proportional to what the call touched, not to the memory.
//!
//! wasmtime does not hand out a component's inner memories; it does let
//! the embedder create every linear memory ([`wasmtime::MemoryCreator`]).
//! [`MappedMemories`] creates them, and [`collect`] records the ones an
//! instantiation on this thread creates, so the instance knows its own.
//!
//! What this does not restore: mutable wasm globals (a stack pointer
//! returns to where it was when a call returns; compilers keep no program
//! data in globals) and table contents (function references only). A
//! memory that grew during a call cannot shrink: that instance is dropped
//! instead of reused. Whatever the guest keeps in memory comes back as it
//! was frozen, its random generators' state included: each call draws the
//! same "random" numbers unless it reseeds from `wasi:random`.
//!
//! The image holds only the pages that hold anything (those written while
//! the instance was made and warmed up); the rest of the file is a hole,
//! so an instance costs what it uses, not what it declares.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// Creates every linear memory of the engine as an mmap reservation of its
/// own, and tells [`collect`] about it.
pub struct MappedMemories;

thread_local! {
    /// The memories created on this thread while [`collect`] runs.
    static COLLECTED: RefCell<Option<Vec<Arc<Mapping>>>> = const { RefCell::new(None) };
}

/// Runs `instantiate` and returns, with its result, the memories it
/// created on this thread.
pub fn collect<R>(instantiate: impl FnOnce() -> R) -> (R, Vec<Arc<Mapping>>) {
    /// Puts the outer collection back however `instantiate` ends (a panic
    /// included), so no memory stays pinned in the thread-local.
    struct Restore(Option<Vec<Arc<Mapping>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            COLLECTED.with(|c| *c.borrow_mut() = outer);
        }
    }
    let restore = Restore(COLLECTED.with(|c| c.borrow_mut().replace(Vec::new())));
    let result = instantiate();
    let mine = COLLECTED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    (result, mine)
}

/// The host's page size.
fn page() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096))
}

/// `/proc/self/pagemap`, opened once for the process.
fn pagemap() -> Result<&'static std::fs::File, String> {
    static PAGEMAP: OnceLock<Result<std::fs::File, String>> = OnceLock::new();
    PAGEMAP
        .get_or_init(|| std::fs::File::open("/proc/self/pagemap").map_err(|e| format!("/proc/self/pagemap: {e}")))
        .as_ref()
        .map_err(Clone::clone)
}

/// One linear memory's address range: reserved whole at creation, never
/// moved, unmapped when both wasmtime and the instance are done with it.
pub struct Mapping {
    base: usize,
    /// Bytes reserved, guard included.
    reserved: usize,
    /// Bytes accessible to the guest.
    size: AtomicUsize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `Mapping::reserve` and nothing
        // refers to it any more (wasmtime's handle and the instance's are
        // both gone).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.reserved) };
    }
}

impl Mapping {
    fn reserve(bytes: usize, guard: usize, minimum: usize) -> Result<Mapping, String> {
        let reserved = bytes.checked_add(guard).ok_or("memory reservation overflows")?;
        // SAFETY: a fresh anonymous reservation, no access until granted.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("reserving {reserved} bytes failed: {}", std::io::Error::last_os_error()));
        }
        let mapping = Mapping { base: base as usize, reserved, size: AtomicUsize::new(0) };
        mapping.grant(0, minimum)?;
        mapping.size.store(minimum, Ordering::Release);
        Ok(mapping)
    }

    /// Makes `from..to` readable and writable.
    fn grant(&self, from: usize, to: usize) -> Result<(), String> {
        if to <= from {
            return Ok(());
        }
        // SAFETY: inside the reservation (grow_to checks against capacity).
        let done = unsafe {
            libc::mprotect((self.base + from) as *mut libc::c_void, to - from, libc::PROT_READ | libc::PROT_WRITE)
        };
        if done != 0 {
            return Err(format!("granting {} bytes of memory failed: {}", to - from, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }
}

struct Handle {
    mapping: Arc<Mapping>,
    capacity: usize,
}

// SAFETY: the range is reserved up front and never moves; `as_ptr` is
// stable for the memory's life, and `grow_to` only grants more of the
// reservation, within `capacity`.
unsafe impl LinearMemory for Handle {
    fn byte_size(&self) -> usize {
        self.mapping.len()
    }

    fn byte_capacity(&self) -> usize {
        self.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        let old = self.mapping.len();
        if new_size > self.capacity {
            wasmtime::bail!("memory cannot grow to {new_size} bytes: {} are reserved", self.capacity);
        }
        self.mapping.grant(old, new_size).map_err(wasmtime::Error::msg)?;
        self.mapping.size.store(new_size.max(old), Ordering::Release);
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.mapping.base as *mut u8
    }
}

// SAFETY: every memory is zero-filled (fresh anonymous pages), reserves
// what wasmtime asks for plus the guard, unmapped past its size.
unsafe impl MemoryCreator for MappedMemories {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let capacity = reserved_size_in_bytes.or(maximum).unwrap_or(4 << 30).max(minimum).next_multiple_of(page());
        let mapping = Arc::new(Mapping::reserve(capacity, guard_size_in_bytes, minimum)?);
        COLLECTED.with(|c| {
            if let Some(mine) = c.borrow_mut().as_mut() {
                mine.push(mapping.clone());
            }
        });
        Ok(Box::new(Handle { mapping, capacity }))
    }
}

/// An instance's memories, frozen: each maps its image copy-on-write.
pub struct Frozen {
    memories: Vec<FrozenMemory>,
    /// Bytes of written pages restored by copying (and kept resident),
    /// whole pages; the rest are dropped.
    keep_resident: usize,
}

/// One memory, frozen.
struct FrozenMemory {
    mapping: Arc<Mapping>,
    /// Its size when frozen.
    len: usize,
    /// A read-only view of its image, the source of restoring copies.
    image: usize,
}

impl Drop for FrozenMemory {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the view was mapped by `Frozen::freeze` and is used
            // by nothing else.
            unsafe { libc::munmap(self.image as *mut libc::c_void, self.len) };
        }
    }
}

/// Why an instance's memories cannot be thawed.
#[derive(Debug)]
pub enum Unfreezable {
    /// A memory grew during the call.
    Grew,
    /// The kernel refused (no memfd, no `PAGEMAP_SCAN`): say why. The
    /// instance's memories are as they were.
    Unsupported(String),
    /// Mapping the image over a memory failed after the kernel had
    /// unmapped what was there: the memory is gone (its range reserved
    /// again, inaccessible) and the instance must never run again.
    Broken(String),
}

/// What one thaw did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Thawed {
    /// Host pages restored by copying.
    pub copied: usize,
    /// Host pages dropped back to the image.
    pub dropped: usize,
}

/// Proof that no call runs in an instance: a mutable borrow of its store,
/// which a call holds for as long as it runs. Freezing or thawing the
/// memories of an instance in the middle of one of its calls would change
/// its memory under it; with this, the compiler refuses such code.
pub struct NoCallRunning<'a>(std::marker::PhantomData<&'a mut ()>);

impl<'a> NoCallRunning<'a> {
    /// No call runs in the instance of `store` while this lives.
    pub fn of<T>(_store: &'a mut wasmtime::Store<T>) -> NoCallRunning<'a> {
        NoCallRunning(std::marker::PhantomData)
    }
}

impl Frozen {
    /// Freezes `memories` as they are now; `quiet` proves that no call
    /// runs in their instance.
    pub fn freeze(
        memories: Vec<Arc<Mapping>>,
        keep_resident: usize,
        quiet: &NoCallRunning<'_>,
    ) -> Result<Frozen, Unfreezable> {
        let unsupported = |what: &str, e: std::io::Error| Unfreezable::Unsupported(format!("{what}: {e}"));
        let pagemap = pagemap().map_err(Unfreezable::Unsupported)?;
        let mut frozen = Vec::with_capacity(memories.len());
        for mapping in memories {
            let (base, len) = (mapping.base, mapping.len());
            // The pages that hold anything: written since the memory was
            // made (its data segments, the warm-up). Only those go into the
            // image; the rest of it is a hole and reads as zeros.
            let filled = written(pagemap, base, len, true)
                .map_err(|e| Unfreezable::Unsupported(format!("PAGEMAP_SCAN: {e}")))?;
            // SAFETY: a new anonymous file, owned by the OwnedFd below.
            let fd = unsafe { libc::memfd_create(c"sluice-plugin-memory".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(unsupported("memfd_create", std::io::Error::last_os_error()));
            }
            // SAFETY: `fd` is open and owned by nothing else.
            let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            file.set_len(len as u64).map_err(|e| unsupported("sizing the image", e))?;
            for (start, end) in filled {
                // SAFETY: inside base..base+len, the guest-accessible part of
                // the mapping, readable; no call runs.
                let pages = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
                std::os::unix::fs::FileExt::write_all_at(&file, pages, (start - base) as u64)
                    .map_err(|e| unsupported("writing the image", e))?;
            }
            if len == 0 {
                frozen.push(FrozenMemory { mapping, len, image: 0 });
                continue;
            }
            // SAFETY: a read-only shared view of the image file.
            let view = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
            if view == libc::MAP_FAILED {
                return Err(unsupported("mapping the image's view", std::io::Error::last_os_error()));
            }
            // From here the view is unmapped with the FrozenMemory.
            let memory = FrozenMemory { mapping, len, image: view as usize };
            // SAFETY: replaces the accessible part of our own reservation
            // with the same bytes, mapped privately; no call runs.
            let mapped = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    fd,
                    0,
                )
            };
            if mapped == libc::MAP_FAILED {
                let error = std::io::Error::last_os_error();
                // The kernel may have unmapped the old pages before failing:
                // reserve the range again, inaccessible, so nothing else is
                // ever mapped where the guest's memory was.
                // SAFETY: our own reservation's range.
                unsafe {
                    libc::mmap(
                        base as *mut libc::c_void,
                        len,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                return Err(Unfreezable::Broken(format!("mapping the image: {error}")));
            }
            frozen.push(memory);
            // The file is closed here; the two mappings keep it.
        }
        let page = page();
        let frozen = Frozen { memories: frozen, keep_resident: keep_resident / page * page };
        // Fail here, not after a call, where the kernel lacks the scan.
        frozen.thaw(quiet)?;
        Ok(frozen)
    }

    /// Puts every page written since the freeze back to the image, so the
    /// memories read as frozen again; `_quiet` proves no call runs.
    ///
    /// Written pages are private copies, found by `PAGEMAP_SCAN`. Up to
    /// `keep_resident` bytes of them are restored by copying the image
    /// over them, and stay mapped: the next call writes them without a
    /// page fault (a Python call writes ~100 pages; dropping and faulting
    /// them in again cost 4 µs a page, copying a fraction of that). Once
    /// written, a kept page stays private, so it is copied after every
    /// call; pages past the budget are dropped (`MADV_DONTNEED`) and read
    /// as the image again, so one large request does not make every later
    /// call copy its pages.
    pub fn thaw(&self, _quiet: &NoCallRunning<'_>) -> Result<Thawed, Unfreezable> {
        let mut thawed = Thawed::default();
        let mut budget = self.keep_resident;
        for memory in &self.memories {
            if memory.mapping.len() != memory.len {
                return Err(Unfreezable::Grew);
            }
            let pagemap = pagemap().map_err(Unfreezable::Unsupported)?;
            // Zero pages count too: in a private file mapping only KSM puts
            // one there, over a page the guest wrote zeros to.
            let ranges = written(pagemap, memory.mapping.base, memory.len, false)
                .map_err(|e| Unfreezable::Unsupported(format!("PAGEMAP_SCAN: {e}")))?;
            for (start, end) in ranges {
                let copied = (end - start).min(budget);
                budget -= copied;
                if copied > 0 {
                    let offset = start - memory.mapping.base;
                    // SAFETY: both ranges lie within `len` bytes of their
                    // mappings (the scan covers only those); the image view
                    // and the memory never overlap; no call runs.
                    unsafe {
                        std::ptr::copy_nonoverlapping((memory.image + offset) as *const u8, start as *mut u8, copied)
                    };
                    thawed.copied += copied / page();
                }
                if start + copied < end {
                    let from = start + copied;
                    // SAFETY: inside the frozen, private file mapping:
                    // dropped pages read as the image again.
                    let done = unsafe { libc::madvise(from as *mut libc::c_void, end - from, libc::MADV_DONTNEED) };
                    if done != 0 {
                        return Err(Unfreezable::Unsupported(format!(
                            "MADV_DONTNEED: {}",
                            std::io::Error::last_os_error()
                        )));
                    }
                    thawed.dropped += (end - from) / page();
                }
            }
        }
        Ok(thawed)
    }
}

/// `struct page_region` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg` of `<linux/fs.h>`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;

/// The address ranges of `base..base + len` written since they were
/// mapped: present or swapped pages that are not the file's (the image)
/// and, with `skip_zero_page`, not the shared zero page (an anonymous page
/// only ever read).
fn written(
    pagemap: &std::fs::File,
    base: usize,
    len: usize,
    skip_zero_page: bool,
) -> std::io::Result<Vec<(usize, usize)>> {
    let unwritten = if skip_zero_page { PAGE_IS_PFNZERO | PAGE_IS_FILE } else { PAGE_IS_FILE };
    let end = (base + len) as u64;
    let mut ranges = Vec::new();
    let mut regions = [PageRegion::default(); 64];
    let mut from = base as u64;
    while from < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: from,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: unwritten,
            category_mask: unwritten,
            // A written page the kernel swapped out is written all the same.
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: 0,
        };
        // SAFETY: `arg` and `regions` outlive the call; the kernel writes
        // at most `vec_len` regions and `walk_end`.
        let found = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg as *mut PmScanArg) };
        if found < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for region in &regions[..found as usize] {
            ranges.push((region.start as usize, region.end as usize));
        }
        if arg.walk_end <= from || (found as usize) < regions.len() {
            break;
        }
        from = arg.walk_end;
    }
    Ok(ranges)
}
