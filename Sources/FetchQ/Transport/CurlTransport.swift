import CCurl
import CFetchQSupport
import Glibc
import Synchronization

/// HTTP over one libcurl multi handle driven by one thread.
///
/// Threading:
/// - `start`, `cancel`, `shutdown` and `activeTransfers` are safe from any thread,
///   including from inside a completion or progress callback.
/// - Completions and progress callbacks run on the loop thread; keep them short
///   and never blocking (the engine parses bodies up to 64 KiB there and hands
///   larger ones, and SQLite writes, to a worker). A completion runs exactly once per `start`,
///   always on the loop thread — except for a `start` made after `shutdown`, whose
///   `.cancelled` completion runs on the caller's thread before `start` returns.
/// - Requests that fail validation (bad method or header syntax, HEAD with a body,
///   negative limits) still complete from the loop thread, with `.invalidRequest`.
///
/// Connections are pooled by the multi handle and reused across transfers; easy
/// handles are recycled with curl_easy_reset. HTTP/2 is negotiated over TLS and
/// multiplexed; cleartext uses HTTP/1.1.
///
/// @unchecked Sendable: every stored property is either immutable (`core`,
/// `loopThread`) or protected by `joinState` (whether the loop thread was joined).
package final class CurlTransport: HTTPTransport, @unchecked Sendable {
    private let core: CurlLoop
    private let loopThread: pthread_t
    /// true once the loop thread was joined; held while joining so a second
    /// `shutdown` waits for the first.
    private let joinState = Locked(false)

    /// - Parameter maxTotalConnections: CURLMOPT_MAX_TOTAL_CONNECTIONS (0 = no limit);
    ///   transfers beyond it wait inside curl for a free connection.
    /// - Parameter onLoopThread: runs first on the loop thread (the engine
    ///   records itself there, see fq_support.h).
    /// - Parameter maxSleepMs: the longest the loop sleeps with nothing to do
    ///   (tests make it long, so that a lost wakeup shows as a stall no
    ///   scheduling delay explains).
    package init(maxTotalConnections: Int = 0, onLoopThread: (@Sendable () -> Void)? = nil,
                 onTurn: (@Sendable (_ turn: LoopTurn) -> Void)? = nil,
                 maxSleepMs: Int32 = 1000) throws(TransportError) {
        let initCode = CurlGlobal.initResult
        guard initCode == CURLE_OK else {
            throw TransportError(
                kind: .network, message: "curl_global_init failed: \(TransportError.curlText(initCode))",
                curlCode: Int(initCode.rawValue))
        }
        let core = try CurlLoop(maxTotalConnections: maxTotalConnections, maxSleepMs: maxSleepMs)
        core.onStart = onLoopThread
        core.onTurn = onTurn
        self.core = core

        // The loop thread starts with the process's signals blocked (see
        // fqs_start_thread_masked): a SIGPIPE from a dead socket becomes EPIPE.
        var thread = pthread_t()
        let context = Unmanaged.passRetained(core).toOpaque()
        let rc = fqs_start_thread_masked(&thread, { context in
            let core = Unmanaged<CurlLoop>.fromOpaque(context!).takeRetainedValue()
            fqs_jansson_cache_thread_enable(1)  // parses responses and frees their values
            core.run()
            return nil
        }, context)
        guard rc == 0 else {
            Unmanaged<CurlLoop>.fromOpaque(context).release()
            throw TransportError(kind: .network, message: "pthread_create failed: \(String(cString: strerror(rc))) (each engine thread reserves an 8 MiB stack)")
        }
        loopThread = thread
    }

    deinit {
        core.close()
        let onLoopThread = isLoopThread
        joinState.withLock { joined in
            guard !joined else { return }
            // The last reference went away inside a callback on the loop thread:
            // it cannot join itself; it finishes on its own.
            if onLoopThread { pthread_detach(loopThread) } else { pthread_join(loopThread, nil) }
            joined = true
        }
    }

    /// Hands the transfer to the loop thread and wakes it. See the type's comment
    /// for where and when `completion` runs.
    package func start(
        _ request: HTTPRequest,
        progress: (@Sendable (_ received: UInt64, _ expected: UInt64) -> Void)?,
        completion: @escaping @Sendable (Result<HTTPResponse, TransportError>) -> Void
    ) -> TransferID {
        core.start(request, progress: progress, completion: completion)
    }

    /// Takes the transfer out of curl (closing its connection if it was mid-response)
    /// on the loop thread's next turn; its completion runs with `.cancelled` unless
    /// it already completed. Unknown or finished ids are ignored.
    package func cancel(_ id: TransferID) {
        core.cancel(id)
    }

    /// Cancels every transfer (completions run with `.cancelled`), stops the loop
    /// thread and waits for it. Idempotent. Called from a callback on the loop
    /// thread it cannot wait: the loop then stops after that callback returns.
    package func shutdown() {
        core.close()
        if isLoopThread { return }
        joinState.withLock { joined in
            guard !joined else { return }
            pthread_join(loopThread, nil)
            joined = true
        }
    }

    /// Started transfers whose completion has not begun yet.
    package var activeTransfers: Int { core.activeCount.load(ordering: .acquiring) }

    /// How many easy handles the loop has made (the rest were reused).
    package var easyHandlesMade: Int { core.easyHandlesMade.load(ordering: .relaxed) }

    /// Whether the calling thread is this transport's loop thread (where
    /// completions run).
    package var isLoopThread: Bool { pthread_equal(pthread_self(), loopThread) != 0 }
}

/// curl_global_init, once per process (a lazily initialized static is thread-safe).
/// Never cleaned up: other libraries in the process may use curl too.
enum CurlGlobal {
    static let initResult: CURLcode = curl_global_init(Int(CURL_GLOBAL_ALL))
}

/// A `start` on its way to the loop thread, which makes the `CurlTransfer`.
///
/// The transfer object (and its error buffer) is allocated by the loop thread,
/// which also frees it: made by the caller, it was freed on the loop thread,
/// and glibc then takes the caller's malloc arena lock for every such free,
/// contending with the workers' JSON parsing (a top source of futex calls in
/// fq_bench p2).
struct CurlStart {
    let id: TransferID
    let request: HTTPRequest
    let progress: CurlTransfer.Progress?
    let completion: CurlTransfer.Completion
    let rejection: TransportError?
}

/// Where a transport's loop thread is, for its `onTurn` callback.
package enum LoopTurn: Sendable {
    /// It has just woken (or started a new turn without sleeping).
    case woke
    /// It is about to sleep in curl_multi_poll, for at most
    /// `CurlLoop.maxSleepMs` (1 s unless a test chose another).
    case sleeping
    /// It is about to exit: nothing more runs on it.
    case exiting
}

/// What callers hand to the loop thread.
struct CurlInbox {
    var starts: [CurlStart] = []
    var cancels: [TransferID] = []
    var closing = false
    /// The loop found the inbox empty and is in (or about to enter)
    /// curl_multi_poll: a hand-over must wake it. While it is awake it
    /// drains the inbox before it sleeps again, so no wakeup is needed.
    var sleeping = false
    /// A wakeup was sent since the loop last drained the inbox.
    var wakeupSent = false

    /// Whether a hand-over made now must wake the loop (at most once per sleep).
    mutating func needsWakeup() -> Bool {
        guard sleeping, !wakeupSent else { return false }
        wakeupSent = true
        return true
    }
}

/// The loop thread's world. The thread holds a strong reference until it exits.
///
/// @unchecked Sendable:
/// - `inbox` (a `Locked`, a pthread mutex) protects everything other threads hand over.
/// - `multi` never changes; other threads only call curl_multi_wakeup on it,
///   which curl documents as callable from any thread. It is cleaned up in deinit,
///   after the loop thread has let go.
/// - `activeCount` and `nextID` are atomics.
/// - `active` and `idleHandles` are touched only on the loop thread.
final class CurlLoop: @unchecked Sendable {
    let multi: UnsafeMutableRawPointer
    let inbox = Locked(CurlInbox())
    let activeCount = Atomic<Int>(0)
    let easyHandlesMade = Atomic<Int>(0)
    private let nextID = Atomic<UInt64>(1)

    /// Set before the loop thread starts; run first on it.
    var onStart: (@Sendable () -> Void)?
    /// Set before the loop thread starts; run on it around each turn (see
    /// `LoopTurn`).
    var onTurn: (@Sendable (_ turn: LoopTurn) -> Void)?
    /// The longest the loop sleeps in curl_multi_poll (ms): it wakes at least
    /// this often even with nothing to do.
    /// (1 s unless a test chose another: CurlTransport.init.)
    let maxSleepMs: Int32
    private var active: [TransferID: CurlTransfer] = [:]
    private var idleHandles: [UnsafeMutableRawPointer] = []
    /// Idle easy handles kept: as many as were ever in curl at once (at least
    /// 32, at most 1 024; an idle handle holds 5-10 KB of curl's memory).
    /// With a fixed 32, 64 concurrent transfers on one loop that ended in
    /// one turn freed half their handles and the next turn made them again:
    /// `curl_easy_cleanup` + `curl_easy_init` for about 0.6 of every request
    /// of P4 at 64 concurrent (bench/findings.md, "Tenth round").
    private var maxIdleHandles: Int { min(max(32, peakActive), 1024) }
    /// The most transfers ever in curl at once; sizes the connection cache.
    private var peakActive = 0

    init(maxTotalConnections: Int, maxSleepMs: Int32) throws(TransportError) {
        guard let multi = curl_multi_init() else {
            throw TransportError(kind: .network, message: "curl_multi_init failed")
        }
        self.multi = multi
        self.maxSleepMs = max(1, maxSleepMs)
        _ = fqc_multi_setopt_long(multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX)
        if maxTotalConnections > 0 {
            _ = fqc_multi_setopt_long(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, maxTotalConnections)
        }
    }

    deinit {
        curl_multi_cleanup(multi)
    }

    // MARK: Any thread

    func start(
        _ request: HTTPRequest,
        progress: CurlTransfer.Progress?,
        completion: @escaping CurlTransfer.Completion
    ) -> TransferID {
        let id = TransferID(rawValue: nextID.wrappingAdd(1, ordering: .relaxed).oldValue)
        let rejection = CurlTransfer.validate(request).map {
            TransportError(kind: .invalidRequest, message: $0)
        }
        let pending = CurlStart(
            id: id, request: request, progress: progress, completion: completion, rejection: rejection)
        activeCount.wrappingAdd(1, ordering: .relaxed)
        let (accepted, wake) = inbox.withLock { box -> (Bool, Bool) in
            if box.closing { return (false, false) }
            box.starts.append(pending)
            return (true, box.needsWakeup())
        }
        if !accepted {
            activeCount.wrappingSubtract(1, ordering: .relaxed)
            completion(.failure(TransportError(
                kind: .cancelled, message: "the transport is shut down")))
        } else if wake {
            curl_multi_wakeup(multi)
        }
        return id
    }

    func cancel(_ id: TransferID) {
        let wake = inbox.withLock { box -> Bool in
            if box.closing { return false }
            box.cancels.append(id)
            return box.needsWakeup()
        }
        if wake { curl_multi_wakeup(multi) }
    }

    func close() {
        let wake = inbox.withLock { box -> Bool in
            if box.closing { return false }
            box.closing = true
            return box.needsWakeup()
        }
        if wake { curl_multi_wakeup(multi) }
    }

    // MARK: Loop thread

    func run() {
        fqc_name_current_thread("fetchq-curl")
        onStart?()
        var running: Int32 = 0
        // Swapped with the inbox's arrays, so their buffers are reused instead
        // of being allocated by callers and freed here for every batch.
        var starts: [CurlStart] = []
        var cancels: [TransferID] = []
        while true {
            starts.removeAll(keepingCapacity: true)
            cancels.removeAll(keepingCapacity: true)
            let closing = inbox.withLock { box in
                swap(&starts, &box.starts)
                swap(&cancels, &box.cancels)
                box.sleeping = false
                box.wakeupSent = false
                return box.closing
            }
            var cancelled = Set(cancels)
            for pending in starts {
                let transfer = CurlTransfer(
                    id: pending.id, request: pending.request, progress: pending.progress,
                    completion: pending.completion, rejection: pending.rejection)
                if cancelled.remove(transfer.id) != nil || closing {
                    deliver(transfer, .failure(cancellation(transfer)))
                } else {
                    begin(transfer)
                }
            }
            for id in cancelled {
                if let transfer = active[id] { abort(transfer) }
            }
            if closing {
                for transfer in Array(active.values) { abort(transfer) }
                break
            }

            if curl_multi_perform(multi, &running) != CURLM_OK {
                // Only on out-of-memory or a broken multi handle; avoid spinning.
                usleep(1000)
            }
            var easy: UnsafeMutableRawPointer?
            var code = CURLE_OK
            while fqc_multi_next_done(multi, &easy, &code) != 0 {
                if let easy, let transfer = transfer(of: easy) { finish(transfer, code) }
            }
            // Sleep only if nothing was handed over meanwhile; from here on a
            // hand-over wakes the poll (see CurlInbox.sleeping).
            let idle = inbox.withLock { box -> Bool in
                guard box.starts.isEmpty, box.cancels.isEmpty, !box.closing else { return false }
                box.sleeping = true
                return true
            }
            // Sleeps until socket activity, curl's next timer, or curl_multi_wakeup.
            if idle {
                onTurn?(.sleeping)
                if curl_multi_poll(multi, nil, 0, maxSleepMs, nil) != CURLM_OK { usleep(1000) }
            }
            onTurn?(.woke)
        }
        for easy in idleHandles { curl_easy_cleanup(easy) }
        idleHandles = []
        onTurn?(.exiting)
    }

    private func transfer(of easy: UnsafeMutableRawPointer) -> CurlTransfer? {
        var pointer: UnsafeMutableRawPointer?
        guard fqc_easy_getinfo_pointer(easy, CURLINFO_PRIVATE, &pointer) == CURLE_OK, let pointer else {
            return nil
        }
        return Unmanaged<CurlTransfer>.fromOpaque(pointer).takeUnretainedValue()
    }

    private func makeEasyHandle() -> UnsafeMutableRawPointer? {
        easyHandlesMade.wrappingAdd(1, ordering: .relaxed)
        return curl_easy_init()
    }

    private func begin(_ transfer: CurlTransfer) {
        if let rejection = transfer.rejection {
            deliver(transfer, .failure(rejection))
            return
        }
        guard let easy = idleHandles.popLast() ?? makeEasyHandle() else {
            deliver(transfer, .failure(TransportError(kind: .network, message: "curl_easy_init failed")))
            return
        }
        transfer.easy = easy
        if let problem = transfer.configure(easy) {
            recycle(transfer)
            deliver(transfer, .failure(TransportError(kind: .invalidRequest, message: problem)))
            return
        }
        let rc = curl_multi_add_handle(multi, easy)
        guard rc == CURLM_OK else {
            recycle(transfer)
            let text = String(cString: curl_multi_strerror(rc))
            deliver(transfer, .failure(TransportError(kind: .network, message: "curl_multi_add_handle: \(text)")))
            return
        }
        active[transfer.id] = transfer
        if active.count > peakActive {
            peakActive = active.count
            // curl's default cache limit is 4 x the transfers in the multi handle
            // *right now*: when a burst drains to one or two transfers, a finishing
            // transfer closes the oldest idle connections, and the next burst opens
            // them again (1 connect per ~10 requests in the P2 benchmark). The same
            // factor on the peak keeps them. Connections idle longer than curl's
            // MAXAGE_CONN (118 s) are still closed.
            _ = fqc_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 4 * peakActive)
        }
    }

    /// curl finished the transfer (successfully or not).
    private func finish(_ transfer: CurlTransfer, _ code: CURLcode) {
        // A 304 the header callback stopped at is the response (see stoppedAt304).
        let code = code == CURLE_WRITE_ERROR && transfer.stoppedAt304 ? CURLE_OK : code
        if code == CURLE_OK, let hop = transfer.nextHop() {
            // A redirect the transfer follows itself (see CurlTransfer.followsItself).
            detach(transfer)
            switch hop {
            case .follow: begin(transfer)
            case .fail(let error): deliver(transfer, .failure(error))
            }
            return
        }
        let result = transfer.result(for: code)
        detach(transfer)
        deliver(transfer, result)
    }

    /// Cancellation: out of curl now, completion with `.cancelled`.
    private func abort(_ transfer: CurlTransfer) {
        detach(transfer)
        deliver(transfer, .failure(cancellation(transfer)))
    }

    private func cancellation(_ transfer: CurlTransfer) -> TransportError {
        TransportError(kind: .cancelled, message: "cancelled")
    }

    private func detach(_ transfer: CurlTransfer) {
        active.removeValue(forKey: transfer.id)
        if let easy = transfer.easy { curl_multi_remove_handle(multi, easy) }
        recycle(transfer)
    }

    /// Returns the transfer's easy handle to the pool, reset, and frees what curl
    /// pointed into. The handle must not be in the multi handle.
    private func recycle(_ transfer: CurlTransfer) {
        guard let easy = transfer.easy else { return }
        transfer.easy = nil
        curl_easy_reset(easy)
        transfer.releaseCurlMemory()
        if idleHandles.count < maxIdleHandles {
            idleHandles.append(easy)
        } else {
            curl_easy_cleanup(easy)
        }
    }

    private func deliver(_ transfer: CurlTransfer, _ result: Result<HTTPResponse, TransportError>) {
        precondition(!transfer.completed, "transfer completed twice")
        transfer.completed = true
        activeCount.wrappingSubtract(1, ordering: .releasing)
        transfer.completion(result)
    }
}
