import CFetchQ
import CJansson
import FetchQ

@c @implementation
public func fq_queue_new(_ handle: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ maxConcurrent: Int32) -> OpaquePointer? {
    guard let e = engine(handle), let name else {
        _ = fail(.invalid, "NULL engine or name")
        return nil
    }
    do {
        return try e.makeQueue(name: try utf8(name, "the queue name"), maxConcurrent: Int(maxConcurrent)).handle
    } catch {
        _ = fail(error)
        return nil
    }
}

@c @implementation
public func fq_queue_free(_ handle: OpaquePointer?) {
    queue(handle)?.close()
}

@c @implementation
public func fq_queue_set_max_concurrent(_ handle: OpaquePointer?, _ n: Int32) -> Int32 {
    guard let q = queue(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try q.setMaxConcurrent(Int(n)) }
}

@c @implementation
public func fq_queue_set_suspended(_ handle: OpaquePointer?, _ suspended: Bool) -> Int32 {
    guard let q = queue(handle) else { return fail(nullHandle) }
    q.setSuspended(suspended)
    return FQStatus.ok.rawValue
}

@c @implementation
public func fq_queue_cancel_all(_ handle: OpaquePointer?) -> Int32 {
    guard let q = queue(handle) else { return fail(nullHandle) }
    return Int32(clamping: q.cancelAll())
}

@c @implementation
public func fq_queue_wait(_ handle: OpaquePointer?, _ timeoutMs: Int32) -> Int32 {
    guard let q = queue(handle) else { return fail(nullHandle) }
    let s = q.wait(timeoutMs: Int(timeoutMs))
    return s == .ok ? s.rawValue : fail(s, s == .timeout
        ? "timed out waiting for queue \"\(q.name)\""
        : "fq_queue_wait cannot be called from a callback or an operation body of the same engine")
}
