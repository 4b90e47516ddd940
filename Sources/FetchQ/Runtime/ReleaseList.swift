import CFetchQSupport
import Synchronization

/// Values handed back to the worker thread that made them, to be freed there.
///
/// glibc gives each thread its own malloc arena. A block freed on another
/// thread goes back to its owner's arena under that arena's lock, and a
/// parsed JSON document is hundreds of small blocks: when results were freed
/// wherever their last reference went (the delivery thread, or whichever
/// worker evicted them from history), the workers' parsing contended for
/// their own arenas and slept on those locks (bench/findings.md, R3).
///
/// A result whose value was made on a worker remembers that worker's list;
/// when the result goes away on any other thread, its value is handed back
/// and the owner frees it after its current job. An owner that is closed
/// takes nothing (`take` returns false and the caller frees the value
/// itself), so nothing waits on a thread that may never run again: a worker
/// closes its list before it sleeps (for as long as no job comes) and as it
/// exits; a transfer thread only as it exits, as it never sleeps longer than
/// its poll's timeout (see `Engine.startTransfer`).
///
/// Response parts (`HTTPDetails`: the body, the header list, built headers
/// and metrics) go back the same way, without the lock: a binding's thread
/// that drops results one by one (Python's asyncio thread) slept on the
/// owner's arena lock for their 3 KB bodies, 0.5 times per request
/// (bench/findings.md, "Seventh round"). They are pushed with a
/// compare-and-swap onto a stack linked through `HTTPDetails.nextReturned`
/// and taken whole with an exchange, by the owner or by a pusher that finds
/// the owner stopped taking meanwhile.
///
/// `@unchecked Sendable`: `items` is guarded by `lock`; `isOpen` is read and
/// written only on the owner thread; `accepting`, `returned` and `waiting`
/// are atomics.
final class ReleaseList: @unchecked Sendable {
    private let lock = ConditionLock()
    private var items: [JSONRef] = []
    /// The owner is awake and will drain before it sleeps or exits.
    private let accepting = Atomic<Bool>(false)
    /// `accepting` as the owner last set it (owner thread only): repeated
    /// `open`/`close` calls cost nothing.
    private(set) var isOpen = false
    /// `items.count`, readable without the lock (a hint for `drain`).
    private let waiting = Atomic<Int>(0)
    /// The top of the stack of response parts handed back: 0, or the bits of
    /// an `Unmanaged<HTTPDetails>` holding one retain.
    private let returned = Atomic<UInt>(0)

    /// The list of the worker running on this thread; nil on other threads.
    static var current: ReleaseList? {
        guard let pointer = fqs_current_release_list() else { return nil }
        return Unmanaged<ReleaseList>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// On the owner thread, once: `current` answers this list from now on
    /// (the pool keeps the list alive longer than the thread).
    func makeCurrent() {
        fqs_set_current_release_list(Unmanaged.passUnretained(self).toOpaque())
    }

    /// Any thread: keeps `value` for the owner to free. False when the owner
    /// is not taking values now; the caller then lets it go itself.
    func take(_ value: JSONRef) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        // Read under the lock: a value appended before `close` stored false
        // is in `items` when `close` takes them after storing false.
        guard accepting.load(ordering: .sequentiallyConsistent) else { return false }
        items.append(value)
        waiting.store(items.count, ordering: .relaxed)
        return true
    }

    /// Any thread: keeps `parts` for the owner to free. False when the owner
    /// is not taking them now, or when `parts` is on a stack already (results
    /// can share one: a result rewritten as cancelled keeps the response);
    /// the caller then lets its reference go itself.
    func take(_ parts: HTTPDetails) -> Bool {
        guard accepting.load(ordering: .sequentiallyConsistent) else { return false }
        guard parts.onReturnedStack.compareExchange(
            expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return false }
        let bits = UInt(bitPattern: Unmanaged.passRetained(parts).toOpaque())
        var top = returned.load(ordering: .sequentiallyConsistent)
        while true {
            parts.nextReturned.store(top, ordering: .relaxed)
            let (pushed, current) = returned.compareExchange(
                expected: top, desired: bits, ordering: .sequentiallyConsistent)
            if pushed { break }
            top = current
        }
        // The owner may have stopped between the check and the push, and
        // emptied the stack before it: then this thread frees what is there,
        // rather than leave it to a thread that may not run again.
        if !accepting.load(ordering: .sequentiallyConsistent) { freeReturned() }
        return true
    }

    /// Frees every response part on the stack (any thread; each part is
    /// taken by exactly one exchange).
    private func freeReturned() {
        var bits = returned.exchange(0, ordering: .sequentiallyConsistent)
        while let pointer = UnsafeRawPointer(bitPattern: bits) {
            let parts = Unmanaged<HTTPDetails>.fromOpaque(pointer)
            let object = parts.takeUnretainedValue()
            bits = object.nextReturned.load(ordering: .relaxed)
            object.onReturnedStack.store(false, ordering: .releasing)  // off the stack: may go on one again
            parts.release()
        }
    }

    /// On the owner: frees what was handed back since the last drain.
    func drain() {
        if returned.load(ordering: .relaxed) != 0 { freeReturned() }
        guard waiting.load(ordering: .relaxed) > 0 else { return }
        freeAll()
    }

    /// Takes everything held under one lock, then releases it on this
    /// thread.
    private func freeAll() {
        var batch: [JSONRef] = []
        lock.withLock {
            swap(&batch, &items)
            waiting.store(0, ordering: .relaxed)
        }
        _ = consume batch
    }

    /// On the owner, when it starts taking jobs again.
    func open() {
        guard !isOpen else { return }
        isOpen = true
        accepting.store(true, ordering: .sequentiallyConsistent)
    }

    /// On the owner, before it sleeps for an unbounded time or exits: takes
    /// nothing more and frees what it holds.
    func close() {
        guard isOpen else { return }
        isOpen = false
        accepting.store(false, ordering: .sequentiallyConsistent)
        freeReturned()
        freeAll()
    }
}
