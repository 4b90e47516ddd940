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
/// saves the hand-off to the delivery thread and waking it. A thread running
/// callbacks (inline or the delivery thread) also runs those posted
/// meanwhile, so nobody wakes the delivery thread for them.
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
    /// Poll mode: held by the thread running callbacks, so that they run one
    /// at a time and in completion order whichever threads dispatch.
    private let dispatching = ConditionLock()
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
    /// each completion in it (events are not counted) and the last
    /// completion's `completionSeq` (completions are called back in the
    /// order of those numbers, whoever runs them: `fq_wait`).
    private let delivered: @Sendable ([QueueID], UInt64) -> Void
    /// Called as each completion's callback returns, with its number.
    private let returned: @Sendable (UInt64) -> Void

    /// Nothing runs until `start`.
    init(mode: Mode, delivered: @escaping @Sendable ([QueueID], UInt64) -> Void,
         returned: @escaping @Sendable (UInt64) -> Void = { _ in }) throws(FetchQError) {
        self.mode = mode
        self.delivered = delivered
        self.returned = returned
        if mode == .poll {
            eventFD = fqs_eventfd()
            if eventFD < 0 { throw FetchQError(.noMemory, "eventfd failed: " + String(cString: strerror(errno))) }
        } else {
            eventFD = -1
        }
    }

    /// Starts the delivery thread (thread and inline modes). `owner` is
    /// recorded as the current engine of the threads running callbacks (see
    /// fq_support.h). Called once, before anything is posted.
    func start(owner: UnsafeRawPointer) throws(FetchQError) {
        self.owner = UInt(bitPattern: owner)
        if mode != .poll { thread = try startThread(name: "fetchq-deliver") { [self] in run() } }
    }

    deinit {
        if eventFD >= 0 { close(eventFD) }
    }

    /// Queues an item. Only the first item of a batch wakes the consumer,
    /// and not while it naps nor while callbacks run: the delivery thread
    /// takes everything waiting when it wakes, and whoever runs callbacks
    /// looks for more before it stops (`run`, `runInline`).
    func post(_ item: consuming Item) {
        lock.lock()
        let wasEmpty = items.isEmpty
        items.append(item)
        if mode == .poll && wasEmpty { signalFD() }
        let wake = mode != .poll && wasEmpty && !napping && !running
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
        let wake = mode != .poll && wasEmpty && !napping && !running
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
    private func call(_ item: Item, _ lastSeq: inout UInt64) -> QueueID? {
        switch item {
        case .completion(let result):
            result.takeCallback().call(result)
            lastSeq = result.completionSeq
            returned(lastSeq)
            return result.queue
        case .event(let event, let handler):
            handler(event)
            return nil
        }
    }

    /// Runs a batch's callbacks in order, then reports the batch once.
    /// `queues` is scratch space, left empty.
    private func callAll(_ batch: [Item], _ queues: inout [QueueID]) {
        var lastSeq: UInt64 = 0
        for item in batch {
            if let queue = call(item, &lastSeq) { queues.append(queue) }
        }
        if !queues.isEmpty {
            delivered(queues, lastSeq)
            queues.removeAll(keepingCapacity: true)
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
            callAll(batch, &queues)
            batch.removeAll(keepingCapacity: batch.capacity <= 4096)
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

    /// How many more batches a thread that ran an inline batch takes from
    /// what was posted meanwhile before it leaves the rest to the delivery
    /// thread (a transfer thread's other transfers wait meanwhile).
    static let inlineRounds = 4

    /// Runs a claimed batch on the calling thread, then what was posted
    /// meanwhile (callbacks of operations that ended on other threads, which
    /// found this batch running), for up to `inlineRounds` more batches; then
    /// lets the delivery thread go on with anything left. Waking the
    /// delivery thread for those was a futex call and two context switches
    /// per callback on a busy engine with two transfer threads
    /// (bench/findings.md, Sixteenth round).
    func runInline(_ batch: [Item]) {
        var queues: [QueueID] = []
        callAll(batch, &queues)
        var more: [Item] = []
        var rounds = 0
        while true {
            lock.lock()
            if items.isEmpty || stopping || rounds == Self.inlineRounds {
                running = false
                let wake = !items.isEmpty || stopping
                lock.unlock()
                if wake { lock.broadcast() }
                return
            }
            items.takeAll(into: &more)
            lock.unlock()
            rounds += 1
            callAll(more, &queues)
            more = []  // empty again: the next `takeAll` hands over its buffer
        }
    }

    /// Poll mode: runs up to `max` waiting callbacks (all if max <= 0) on the
    /// calling thread and returns how many ran. When another thread is
    /// running callbacks: with `waitForOthers`, after it; without, returns
    /// nil at once (that thread runs these too, or the caller dispatches
    /// again).
    func dispatch(max: Int, waitForOthers: Bool = true) -> Int? {
        if waitForOthers {
            dispatching.lock()
        } else if !dispatching.tryLock() {
            return nil
        }
        defer { dispatching.unlock() }
        let previous = fqs_current_engine()
        fqs_set_current_engine(UnsafeRawPointer(bitPattern: owner))
        defer { fqs_set_current_engine(previous) }
        // Only what waits now: callbacks that post more do not extend this call.
        var batch: [Item] = []
        lock.withLock {
            let limit = max > 0 ? Swift.min(max, items.count) : items.count
            for _ in 0..<limit { batch.append(items.removeFirst()) }
            // The fd stays readable while items wait. Those left by a
            // `max` get a write of their own too: an edge-triggered
            // (EPOLLET) watcher hears of them only through a new write.
            if items.isEmpty { drainFD() } else if limit > 0 { signalFD() }
        }
        var queues: [QueueID] = []
        callAll(batch, &queues)
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
