import CJansson
import Synchronization

/// What an operation does when it starts.
public enum OperationBody: Sendable {
    /// Runs on a worker; returns the value (or nil). Call `setError` to fail.
    case block(@Sendable (Operation) -> JSONRef?)
    /// Runs on a worker and returns; the operation stays running until
    /// `finish` is called, from any thread.
    case async(@Sendable (Operation) -> Void)
    /// A request or search: sent by the transport, parsed on a worker.
    /// Indirect: a NetworkJob is ~340 bytes, which every block operation
    /// would otherwise carry inline (measured by the P5 benchmark).
    indirect case network(NetworkJob)
}

/// An operation as its body sees it (`fq_op` in C).
///
/// `@unchecked Sendable`: `cancelled` and `finishing` are atomics;
/// `dependencies` is written before the body is queued to a worker (the
/// pool's lock orders it) and only read afterwards; `errorMessage` is written
/// and read on the body's own thread.
public final class Operation: @unchecked Sendable {
    public let id: OpID
    let queue: QueueID
    let qos: QoS
    let body: OperationBody
    let completion: Completion?
    unowned let engine: Engine
    private let cancelled = Atomic<Bool>(false)
    private let finishing = Atomic<Bool>(false)
    var dependencies: [SchedulerStateMachine<OperationResult>.Dependency] = []
    var errorMessage: String?
    /// The status a failing block body reports (FQ_ERR_OPERATION unless the
    /// engine's own bodies, like a search-all merge, say otherwise).
    var errorStatus = FQStatus.operation
    /// A search-all's parent and children share one family.
    var family: SearchAllFamily?
    let submittedAt = monotonicNanos()
    /// Network operations: when the transfer started, and its id (both
    /// guarded by the engine's lock).
    var startedAt: UInt64 = 0
    var transfer: TransferID? = nil
    /// Attempts made so far (retries), guarded by the engine's lock.
    var attempts = 0
    /// The last progress reported (received, expected), guarded by the engine's lock.
    var lastProgress: (UInt64, UInt64) = (0, 0)
    /// A coalesced caller: the transfer it shares (guarded by the engine's lock).
    var shared: SharedTransfer?
    /// A carrier: the engine-internal operation running a shared transfer.
    var carries: SharedTransfer?

    init(id: OpID, queue: QueueID, qos: QoS, body: OperationBody, completion: Completion?, engine: Engine) {
        self.id = id
        self.queue = queue
        self.qos = qos
        self.body = body
        self.completion = completion
        self.engine = engine
    }

    /// The handle C code sees. Valid while the engine holds the operation.
    public var handle: OpaquePointer { OpaquePointer(Unmanaged.passUnretained(self).toOpaque()) }

    public static func from(handle: OpaquePointer) -> Operation {
        Unmanaged<Operation>.fromOpaque(UnsafeRawPointer(handle)).takeUnretainedValue()
    }

    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    func markCancelled() { cancelled.store(true, ordering: .releasing) }

    /// Claims the right to finish; true exactly once.
    func claimFinish() -> Bool {
        !finishing.exchange(true, ordering: .acquiringAndReleasing)
    }

    /// Block operations: fail with this message when the body returns.
    public func setError(_ message: String) throws(FetchQError) {
        guard case .block = body else {
            throw FetchQError(.state, "fq_op_set_error is for block operations; finish an async operation with fq_op_finish")
        }
        errorMessage = message
    }

    /// Async operations: ends the operation (exactly once).
    public func finish(value: JSONRef?, error: String?) throws(FetchQError) {
        guard case .async = body else {
            throw FetchQError(.state, "fq_op_finish is for async operations; a block operation ends when its function returns")
        }
        guard claimFinish() else {
            throw FetchQError(.state, "operation \(id) was already finished")
        }
        engine.bodyEnded(self, value: value, error: error)
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
