import CFetchQSupport
import Glibc

/// A completion callback: called exactly once per submitted operation.
public typealias Completion = @Sendable (OperationResult) -> Void

/// Where callbacks run: the delivery thread; the delivery thread or the
/// worker that ended the operation (`inline`); or the thread that dispatches.
public enum DeliveryMode: Sendable { case thread, inline, poll }

/// Hands finished operations to their callbacks: on one delivery thread
/// (callbacks serialized, in completion order), or in poll mode on whichever
/// thread calls `dispatch`, with an eventfd readable while items wait.
/// Inline mode keeps the delivery thread's order and one-at-a-time rule but
/// lets the worker that ended an operation run the callbacks itself when
/// nothing waits and no callback runs (`claimInline`/`runInline`), which
/// saves the hand-off to the delivery thread and waking it.
///
/// On a busy engine the delivery thread does not sleep between batches: it
/// naps for `napNanos` and nobody wakes it meanwhile (see `run`), so a
/// callback may wait up to a nap for it, and the engine's threads are not
/// paying a wake-up per completion.
///
/// `@unchecked Sendable`: `items`, `stopping`, `running`, `napping` and
/// `napsLeft` are guarded by `lock`; `owner` and `thread` are written in
/// `start` (before any thread reads them) and `thread` read in `stop()` only.
final class Delivery: @unchecked Sendable {
    typealias Mode = DeliveryMode

    /// A completion (counted as outstanding until its callback returned;
    /// the result carries its callback and queue), or an event for the
    /// engine's event handler.
    enum Item {
        case completion(OperationResult)
        case event(OperationEvent, EventHandler)
    }

    let mode: Mode
    /// Poll mode's eventfd; -1 in thread mode.
    let eventFD: Int32
    private let lock = ConditionLock()
    private var items = Ring<Item>()
    /// The delivery thread naps (see `run`); posters leave it be meanwhile.
    private var napping = false
    private var napsLeft = 0
    /// How long a nap lasts: what a callback may wait on a busy engine.
    static let napNanos: UInt64 = 100_000
    private var stopping = false
    /// Some thread is running callbacks (the delivery thread with a batch,
    /// or an engine thread that claimed an inline batch): nobody else may
    /// start one, so callbacks stay serialized and in order.
    private var running = false
    private var thread: pthread_t?
    private var owner: UInt = 0
    /// Called after a batch of callbacks has returned, with the queue of
    /// each completion in it (events are not counted).
    private let delivered: @Sendable ([QueueID]) -> Void

    /// Nothing runs until `start`.
    init(mode: Mode, delivered: @escaping @Sendable ([QueueID]) -> Void) throws(FetchQError) {
        self.mode = mode
        self.delivered = delivered
        if mode == .poll {
            eventFD = fqs_eventfd()
            if eventFD < 0 { throw FetchQError(.noMemory, "eventfd failed: errno \(errno)") }
        } else {
            eventFD = -1
        }
    }

    /// Starts the delivery thread (thread and inline modes). `owner` is
    /// recorded as the current engine of the threads running callbacks (see
    /// fq_support.h). Called once, before anything is posted.
    func start(owner: UnsafeRawPointer) {
        self.owner = UInt(bitPattern: owner)
        if mode != .poll { thread = startThread(name: "fetchq-deliver") { [self] in run() } }
    }

    deinit {
        if eventFD >= 0 { close(eventFD) }
    }

    /// Queues an item. Only the first item of a batch wakes the consumer,
    /// and not while it naps: the delivery thread takes everything waiting
    /// when it wakes, so signalling for every item only paid for futex calls.
    func post(_ item: consuming Item) {
        lock.lock()
        let wasEmpty = items.isEmpty
        items.append(item)
        if mode == .poll && wasEmpty { signalFD() }
        let wake = mode != .poll && wasEmpty && !napping
        lock.unlock()
        if wake { lock.signal() }
    }

    /// Queues items in order with one lock round trip (and at most one wake).
    func post(contentsOf batch: [Item]) {
        guard !batch.isEmpty else { return }
        lock.lock()
        let wasEmpty = items.isEmpty
        for item in batch { items.append(item) }
        if mode == .poll && wasEmpty { signalFD() }
        let wake = mode != .poll && wasEmpty && !napping
        lock.unlock()
        if wake { lock.signal() }
    }

    private func signalFD() {
        var one: UInt64 = 1
        _ = write(eventFD, &one, 8)
    }

    private func drainFD() {
        var count: UInt64 = 0
        _ = read(eventFD, &count, 8)
    }

    /// Runs one item's callback; returns the queue of a completion.
    private func call(_ item: Item) -> QueueID? {
        switch item {
        case .completion(let result):
            result.takeCallback().call(result)
            return result.queue
        case .event(let event, let handler):
            handler(event)
            return nil
        }
    }

    /// Takes everything waiting in one lock round trip, runs the callbacks in
    /// order, then reports the batch once.
    private func run() {
        fqs_set_current_engine(UnsafeRawPointer(bitPattern: owner))
        var batch: [Item] = []
        var queues: [QueueID] = []
        while true {
            lock.lock()
            // An inline batch always ends first, stopping or not. With
            // nothing to do right after a batch, nap instead of sleeping:
            // posters do not wake a napping thread (a futex call and a
            // context switch per callback on a busy engine), it looks again
            // when the nap ends. A nap that found nothing ends the napping.
            while running || (items.isEmpty && !stopping) {
                if !running && napsLeft > 0 {
                    napsLeft -= 1
                    napping = true
                    lock.wait(until: monotonicNanos() &+ Self.napNanos)
                    napping = false
                    continue
                }
                lock.wait(until: nil)
            }
            napsLeft = 1
            if items.isEmpty {
                lock.unlock()
                return
            }
            items.takeAll(into: &batch)
            running = true
            lock.unlock()
            for item in batch {
                if let queue = call(item) { queues.append(queue) }
            }
            batch.removeAll(keepingCapacity: batch.capacity <= 4096)
            if !queues.isEmpty { delivered(queues) }
            queues.removeAll(keepingCapacity: true)
            lock.withLock { running = false }
        }
    }

    /// Inline mode: claims the right to run a batch of callbacks on the
    /// calling thread. Succeeds only when nothing waits and no callback
    /// runs, so running the batch now keeps completion order. The caller
    /// must then call `runInline` (with the items it would have posted).
    func claimInline() -> Bool {
        guard mode == .inline else { return false }
        lock.lock()
        defer { lock.unlock() }
        guard items.isEmpty, !running, !stopping else { return false }
        running = true
        return true
    }

    /// Runs a claimed batch on the calling thread, then lets the delivery
    /// thread go on with what was posted meanwhile.
    func runInline(_ batch: [Item]) {
        var queues: [QueueID] = []
        for item in batch {
            if let queue = call(item) { queues.append(queue) }
        }
        if !queues.isEmpty { delivered(queues) }
        let wake = lock.withLock {
            running = false
            return !items.isEmpty || stopping
        }
        if wake { lock.broadcast() }
    }

    /// Poll mode: runs up to `max` waiting callbacks (all if max <= 0) on the
    /// calling thread; returns how many ran.
    func dispatch(max: Int) -> Int {
        let previous = fqs_current_engine()
        fqs_set_current_engine(UnsafeRawPointer(bitPattern: owner))
        defer { fqs_set_current_engine(previous) }
        // Only what waits now: callbacks that post more do not extend this call.
        var batch: [Item] = []
        lock.withLock {
            let limit = max > 0 ? Swift.min(max, items.count) : items.count
            for _ in 0..<limit { batch.append(items.removeFirst()) }
            if items.isEmpty { drainFD() }
        }
        var queues: [QueueID] = []
        for item in batch {
            if let queue = call(item) { queues.append(queue) }
        }
        if !queues.isEmpty { delivered(queues) }
        return batch.count
    }

    var waiting: Int { lock.withLock { items.count } }

    /// Thread mode: delivers what is queued, then stops the thread.
    func stop() {
        lock.withLock { stopping = true }
        lock.broadcast()
        if let thread { joinThread(thread) }
        thread = nil
    }
}
