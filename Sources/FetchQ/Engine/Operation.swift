import CJansson
import Synchronization

/// What an operation does when it starts.
public enum OperationBody: Sendable {
    /// Runs on a worker; returns the value (or nil). Call `setError` to fail.
    case block(@Sendable (Operation) -> JSONRef?)
    /// Runs on a worker and returns; the operation stays running until
    /// `finish` is called, from any thread.
    case async(@Sendable (Operation) -> Void)
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
    var dependencies: [(OpID, OperationResult?)] = []
    var errorMessage: String?

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
        dependencies.first(where: { $0.0 == dep })?.1?.value
    }
}
