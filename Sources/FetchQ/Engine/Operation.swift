import CJansson
import Synchronization

/// A C block body (`fq_block_fn`): the operation's handle and userdata.
public typealias CBlockFunction = @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> UnsafeMutablePointer<json_t>?
/// A C async body (`fq_async_fn`).
public typealias CAsyncFunction = @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void
/// A C completion (`fq_completion_fn`): the result's handle and userdata.
public typealias CCompletionFunction = @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void

/// What an operation does when it starts.
///
/// `@unchecked Sendable`: the closures are `@Sendable`; the C cases hold a
/// function pointer and the submitter's userdata, which the C API hands to
/// the engine's threads by contract (include/fetchq.h).
public enum OperationBody: @unchecked Sendable {
    /// Runs on a worker; returns the value (or nil). Call `setError` to fail.
    case block(@Sendable (Operation) -> JSONRef?)
    /// Runs on a worker and returns; the operation stays running until
    /// `finish` is called, from any thread.
    case async(@Sendable (Operation) -> Void)
    /// `block` and `async` for C functions, stored as they are: no closure
    /// to allocate per operation.
    case cBlock(CBlockFunction, UnsafeMutableRawPointer?)
    case cAsync(CAsyncFunction, UnsafeMutableRawPointer?)
    /// A request or search: sent by the transport, parsed on a worker.
    /// Indirect: a NetworkJob is ~340 bytes, which every block operation
    /// would otherwise carry inline (measured by the P5 benchmark).
    indirect case network(NetworkJob)
}

/// Who gets an operation's result: nobody, a Swift closure, or a C function
/// with its userdata (no closure allocated per operation).
///
/// `@unchecked Sendable`: as for `OperationBody`'s C cases.
public enum Callback: @unchecked Sendable {
    case none
    case swift(Completion)
    case c(CCompletionFunction, UnsafeMutableRawPointer?)

    public init(_ completion: Completion?) {
        self = completion.map { .swift($0) } ?? .none
    }

    func call(_ result: OperationResult) {
        switch self {
        case .none: break
        case .swift(let completion): completion(result)
        case .c(let fn, let userdata): fn(OpaquePointer(Unmanaged.passUnretained(result).toOpaque()), userdata)
        }
    }
}

/// An operation as its body sees it (`fq_op` in C).
///
/// `@unchecked Sendable`: `cancelled` and `finishing` are atomics;
/// `dependencies` is written before the body is queued to a worker (the
/// pool's lock orders it) and only read afterwards; `errorMessage` is written
/// and read on the body's own thread.
public final class Operation: @unchecked Sendable {
    /// Set once, before the operation is visible to any other thread (at
    /// its submit, or under the engine's lock when the scheduler books it).
    public internal(set) var id: OpID
    let queue: QueueID
    let qos: QoS
    let body: OperationBody
    let callback: Callback
    /// Not reference-counted: the engine outlives its operations (it frees
    /// only after every callback returned), and counting it from every
    /// thread made one contended cache line of the engine object.
    unowned(unsafe) let engine: Engine
    private let cancelled = Atomic<Bool>(false)
    private let finishing = Atomic<Bool>(false)
    var dependencies: [Engine.Machine.Dependency] = []
    var errorMessage: String?
    /// The status a failing block body reports (FQ_ERR_OPERATION unless the
    /// engine's own bodies, like a search-all merge, say otherwise).
    var errorStatus = FQStatus.operation
    /// A search-all's parent and children share one family.
    var family: SearchAllFamily?
    let submittedAt: UInt64
    /// What only a request or search has (nil for block and async
    /// operations, which then carry about 80 bytes less: P5, and P1's
    /// memory traffic).
    private let net: NetworkState?

    /// Network operations: when the transfer started (guarded by the
    /// engine's lock), and its id (guarded by `Engine.transferLock`).
    var startedAt: UInt64 {
        get { net?.startedAt ?? 0 }
        set { net?.startedAt = newValue }
    }
    var transfer: TransferID? {
        get { net?.transfer }
        set { net?.transfer = newValue }
    }
    /// The transport running `transfer` (guarded by `Engine.transferLock`).
    var transport: CurlTransport? {
        get { net?.transport }
        set { net?.transport = newValue }
    }
    /// Attempts made so far (retries), guarded by the engine's lock.
    var attempts: Int {
        get { net?.attempts ?? 0 }
        set { net?.attempts = newValue }
    }
    /// The last progress reported (received, expected), nil before the
    /// first; guarded by the engine's lock.
    var lastProgress: (UInt64, UInt64)? {
        get { net?.lastProgress }
        set { net?.lastProgress = newValue }
    }
    /// See `NetworkState.nextAttemptCache` (guarded by the engine's lock).
    var nextAttemptCache: Engine.CacheContext? {
        get { net?.nextAttemptCache }
        set { net?.nextAttemptCache = newValue }
    }
    /// A coalesced caller: the transfer it shares (guarded by the engine's lock).
    var shared: SharedTransfer? {
        get { net?.shared }
        set { net?.shared = newValue }
    }
    /// A carrier: the engine-internal operation running a shared transfer.
    var carries: SharedTransfer? {
        get { net?.carries }
        set { net?.carries = newValue }
    }
    /// The first caller of a shared transfer, which runs it (guarded by the
    /// engine's lock; cleared when it hands the transfer on or ends).
    var leads: SharedTransfer? {
        get { net?.leads }
        set { net?.leads = newValue }
    }
    /// A leading caller cancelled while its transfer ran for other callers:
    /// the carrier that took the transfer over (written under the engine's
    /// lock and `Engine.transferLock`, read under either).
    var handedTo: Operation? {
        get { net?.handedTo }
        set { net?.handedTo = newValue }
    }

    init(id: OpID, queue: QueueID, qos: QoS, body: OperationBody, callback: Callback, engine: Engine,
         submittedAt: UInt64 = monotonicNanos()) {
        self.submittedAt = submittedAt
        self.id = id
        self.queue = queue
        self.qos = qos
        self.body = body
        self.callback = callback
        self.engine = engine
        if case .network = body { net = NetworkState() } else { net = nil }
    }

    /// The handle C code sees. Valid while the engine holds the operation.
    public var handle: OpaquePointer { OpaquePointer(Unmanaged.passUnretained(self).toOpaque()) }

    public static func from(handle: OpaquePointer) -> Operation {
        Unmanaged<Operation>.fromOpaque(UnsafeRawPointer(handle)).takeUnretainedValue()
    }

    /// A request or search (run by a transport, not on a worker).
    var isNetwork: Bool {
        if case .network = body { return true }
        return false
    }

    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    func markCancelled() { cancelled.store(true, ordering: .releasing) }

    /// Claims the right to finish; true exactly once.
    func claimFinish() -> Bool {
        !finishing.exchange(true, ordering: .acquiringAndReleasing)
    }

    /// Block operations: fail with this message when the body returns.
    public func setError(_ message: String) throws(FetchQError) {
        switch body {
        case .block, .cBlock: break
        default:
            throw FetchQError(.state, "fq_op_set_error is for block operations; finish an async operation with fq_op_finish")
        }
        errorMessage = message
    }

    /// Async operations: ends the operation (exactly once).
    public func finish(value: JSONRef?, error: String?) throws(FetchQError) {
        switch body {
        case .async, .cAsync: break
        default:
            throw FetchQError(.state, "fq_op_finish is for async operations; a block operation ends when its function returns")
        }
        guard claimFinish() else {
            throw FetchQError(.state, "operation \(id) was already finished")
        }
        // Any thread may finish an async operation while another frees the
        // engine: once the callback has run (on another thread), the free
        // may go on while this thread is still on its way out of
        // `bodyEnded`, after the lock. The references taken here keep the
        // engine and the operation until then (the ninth review's reading;
        // the release build already took one for the call, which nothing
        // promised; a worker needs none: the engine joins its workers first).
        let engine: Engine = self.engine
        withExtendedLifetime((self, engine)) {
            _ = engine.bodyEnded(self, value: value, error: error)
        }
    }

    /// The value of a dependency named in depends_on, or nil.
    public func dependencyResult(_ dep: OpID) -> JSONRef? {
        dependency(dep)?.value
    }

    /// The whole result of a dependency (status, body, ... of a request).
    public func dependency(_ dep: OpID) -> OperationResult? {
        dependencies.first(where: { $0.id == dep })?.payload
    }
}

/// The fields of `Operation` that only a request or search uses (see
/// there: guarded by the engine's lock, and `transfer`, `transport` and
/// `handedTo` by `Engine.transferLock`).
final class NetworkState {
    var startedAt: UInt64 = 0
    var transfer: TransferID? = nil
    var transport: CurlTransport? = nil
    var attempts = 0
    var lastProgress: (UInt64, UInt64)? = nil
    var shared: SharedTransfer?
    var carries: SharedTransfer?
    var leads: SharedTransfer?
    var handedTo: Operation?
    /// The cache context of the first attempt, which the next one keeps: a
    /// retry sends the same validators, stores its answer and keeps the
    /// stale value stale-while-revalidate delivered; after a 304 that no
    /// entry could take, it is made without validators (guarded by the
    /// engine's lock).
    var nextAttemptCache: Engine.CacheContext?
}
