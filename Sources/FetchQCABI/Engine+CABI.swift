import CFetchQ
import CFetchQSupport
import CJansson
import FetchQ
import Glibc
import Logging

@c @implementation
public func fq_version() -> UInt32 { fetchqVersionHex }

@c @implementation
public func fq_version_string() -> UnsafePointer<CChar>? { cString(fetchqVersionStaticString) }

@c @implementation
public func fq_strerror(_ status: Int32) -> UnsafePointer<CChar>? {
    cString(FQStatus(rawValue: status)?.staticDescription ?? "unknown status")
}

@c @implementation
public func fq_last_error() -> UnsafePointer<CChar>? { fqs_last_error() }

@c @implementation
public func fq_last_status() -> Int32 { fqs_last_status() }

@c @implementation
public func fq_engine_new(_ config: UnsafePointer<json_t>?, _ errbuf: UnsafeMutablePointer<CChar>?,
                          _ errlen: Int) -> OpaquePointer? {
    do {
        let engine = try Engine(json: config)
        return OpaquePointer(Unmanaged.passRetained(engine).toOpaque())
    } catch {
        _ = fail(error)
        copyMessage(error.message, into: errbuf, errlen)
        return nil
    }
}

@c @implementation
public func fq_engine_free(_ handle: OpaquePointer?) -> Int32 {
    guard let handle, let e = engine(handle) else { return FQStatus.ok.rawValue }
    let s = e.shutdown()
    guard s == .ok else {
        return fail(s, "fq_engine_free cannot be called from a callback or an operation body of the same engine")
    }
    Unmanaged<Engine>.fromOpaque(UnsafeRawPointer(handle)).release()
    return FQStatus.ok.rawValue
}

@c @implementation
public func fq_engine_wait_idle(_ handle: OpaquePointer?, _ timeoutMs: Int32) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    let s = e.waitIdle(timeoutMs: Int(timeoutMs))
    return s == .ok ? s.rawValue : fail(s, s == .timeout
        ? "timed out waiting for the engine to become idle"
        : "fq_engine_wait_idle cannot be called from a callback or an operation body of the same engine")
}

@c @implementation
public func fq_engine_stats(_ handle: OpaquePointer?) -> UnsafeMutablePointer<json_t>? {
    guard let e = engine(handle) else {
        _ = fail(nullHandle)
        return nil
    }
    return e.stats().newReference()
}

@c @implementation
public func fq_engine_event_fd(_ handle: OpaquePointer?) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    guard e.deliveryMode == .poll else {
        return fail(.invalid, "fq_engine_event_fd needs config \"delivery\": \"poll\"")
    }
    return e.eventFD
}

@c @implementation
public func fq_engine_dispatch(_ handle: OpaquePointer?, _ max: Int32) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    do {
        return Int32(try e.dispatch(max: Int(max)))
    } catch {
        return fail(error)
    }
}

@c @implementation
public func fq_cancel(_ handle: OpaquePointer?, _ id: fq_op_id) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try e.cancel(id) }
}

@c @implementation
public func fq_state(_ handle: OpaquePointer?, _ id: fq_op_id) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    do {
        return try e.state(of: id).rawValue
    } catch {
        return fail(error)
    }
}

@c @implementation
public func fq_wait(_ handle: OpaquePointer?, _ id: fq_op_id, _ timeoutMs: Int32) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    do {
        let status = try e.wait(for: id, timeoutMs: Int(timeoutMs))
        return status == .ok ? status.rawValue
            : fail(status, "operation \(id) did not end, or its callback did not return, within \(timeoutMs) ms")
    } catch {
        return fail(error)
    }
}

@c @implementation
public func fq_cancel_group(_ handle: OpaquePointer?, _ group: UnsafePointer<CChar>?) -> Int32 {
    guard let e = engine(handle), let group else { return fail(.invalid, "NULL engine or group") }
    do {
        return Int32(clamping: e.cancelGroup(try utf8(group, "the group")))
    } catch {
        return fail(error)
    }
}

@c @implementation
public func fq_cancel_all(_ handle: OpaquePointer?) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    return Int32(clamping: e.cancelAll())
}

@c @implementation
public func fq_set_priority(_ handle: OpaquePointer?, _ id: fq_op_id, _ priority: Int32) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    guard let p = Priority(rawValue: Int(priority)) else {
        return fail(.invalid, "priority \(priority) is not one of -8, -4, 0, 4, 8")
    }
    return status { () throws(FetchQError) in try e.setPriority(id, p) }
}

@c @implementation
public func fq_add_dependency(_ handle: OpaquePointer?, _ id: fq_op_id, _ dep: fq_op_id) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try e.addDependency(id, on: dep) }
}

@c @implementation
public func fq_remove_dependency(_ handle: OpaquePointer?, _ id: fq_op_id, _ dep: fq_op_id) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try e.removeDependency(id, on: dep) }
}

@c @implementation
public func fq_engine_set_log_fn(_ handle: OpaquePointer?, _ fn: fq_log_fn?, _ userdata: UnsafeMutableRawPointer?) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    let ud = UserData(pointer: userdata)
    guard let fn else {
        e.setLogCallback(nil)
        return FQStatus.ok.rawValue
    }
    e.setLogCallback { (level: Logger.Level, message: String) in
        message.withCString { fn(Int32(logLevelNumber(level)), $0, ud.pointer) }
    }
    return FQStatus.ok.rawValue
}

/// FQ_LOG_* numbers, in swift-log's order (trace = 0 ... critical = 6).
func logLevelNumber(_ level: Logger.Level) -> Int {
    Logger.Level.allCases.firstIndex(of: level) ?? 0
}
