/// A queue of operations (`fq_queue` in C): ordering and max concurrency.
/// Several queues share one engine's workers, delivery and transport.
/// The engine keeps it alive until `close()` (fq_queue_free) or shutdown.
public final class Queue: Sendable {
    public let id: QueueID
    public let name: String
    public unowned let engine: Engine

    init(id: QueueID, name: String, engine: Engine) {
        self.id = id
        self.name = name
        self.engine = engine
    }

    /// The handle C code sees; valid until fq_queue_free or fq_engine_free.
    public var handle: OpaquePointer { OpaquePointer(Unmanaged.passUnretained(self).toOpaque()) }

    public static func from(handle: OpaquePointer) -> Queue {
        Unmanaged<Queue>.fromOpaque(UnsafeRawPointer(handle)).takeUnretainedValue()
    }

    public func setMaxConcurrent(_ n: Int) throws(FetchQError) { try engine.setMaxConcurrent(id, n) }
    public func setSuspended(_ suspended: Bool) { engine.setSuspended(id, suspended) }
    /// Cancels every unfinished operation of the queue; returns how many.
    public func cancelAll() -> Int { engine.cancelQueue(id) }
    /// Waits until all its operations ended and their callbacks returned.
    public func wait(timeoutMs: Int) -> FQStatus { engine.wait(queue: id, timeoutMs: timeoutMs) }
    /// Cancels what has not started and releases the queue.
    public func close() { engine.closeQueue(id) }
}
