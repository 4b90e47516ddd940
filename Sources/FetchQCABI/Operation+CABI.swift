import CFetchQ
import CJansson
import FetchQ

/// Wraps a C completion function as a Swift completion.
func completion(_ done: fq_completion_fn?, _ userdata: UserData) -> Completion? {
    guard let done else { return nil }
    return { result in
        done(OpaquePointer(Unmanaged.passUnretained(result).toOpaque()), userdata.pointer)
    }
}

/// A submit's return value: the id, or the negative status.
func submitted(_ body: () throws(FetchQError) -> OpID) -> fq_op_id {
    do {
        return try body()
    } catch {
        return fq_op_id(fail(error))
    }
}

@c @implementation
public func fq_submit_block(_ handle: OpaquePointer?, _ fn: fq_block_fn?, _ options: UnsafePointer<json_t>?,
                            _ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    guard let q = queue(handle), let fn else { return fq_op_id(fail(.invalid, "NULL queue or function")) }
    let ud = UserData(pointer: userdata)
    return submitted { () throws(FetchQError) in
        try q.engine.submit(.block { op in JSONRef.adopt(fn(op.handle, ud.pointer)) },
                            to: q, options: options, completion: completion(done, ud))
    }
}

@c @implementation
public func fq_submit_async(_ handle: OpaquePointer?, _ fn: fq_async_fn?, _ options: UnsafePointer<json_t>?,
                            _ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    guard let q = queue(handle), let fn else { return fq_op_id(fail(.invalid, "NULL queue or function")) }
    let ud = UserData(pointer: userdata)
    return submitted { () throws(FetchQError) in
        try q.engine.submit(.async { op in fn(op.handle, ud.pointer) },
                            to: q, options: options, completion: completion(done, ud))
    }
}

@c @implementation
public func fq_op_get_id(_ handle: OpaquePointer?) -> fq_op_id {
    guard let op = operation(handle) else { return fq_op_id(fail(nullHandle)) }
    return op.id
}

@c @implementation
public func fq_op_is_cancelled(_ handle: OpaquePointer?) -> Bool {
    operation(handle)?.isCancelled ?? false
}

@c @implementation
public func fq_op_set_error(_ handle: OpaquePointer?, _ message: UnsafePointer<CChar>?) -> Int32 {
    guard let op = operation(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try op.setError(string(message) ?? "operation failed") }
}

@c @implementation
public func fq_op_finish(_ handle: OpaquePointer?, _ value: UnsafeMutablePointer<json_t>?,
                         _ error: UnsafePointer<CChar>?) -> Int32 {
    let owned = JSONRef.adopt(value)  // stolen: released here on any failure
    guard let op = operation(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try op.finish(value: owned, error: string(error)) }
}

@c @implementation
public func fq_op_dependency_result(_ handle: OpaquePointer?, _ dep: fq_op_id) -> UnsafeMutablePointer<json_t>? {
    operation(handle)?.dependencyResult(dep)?.raw
}

@c @implementation
public func fq_result_op_id(_ handle: OpaquePointer?) -> fq_op_id { result(handle)?.id ?? 0 }

@c @implementation
public func fq_result_outcome(_ handle: OpaquePointer?) -> fq_outcome {
    fq_outcome(rawValue: UInt32(result(handle)?.outcome.rawValue ?? 0))
}

@c @implementation
public func fq_result_status(_ handle: OpaquePointer?) -> Int32 {
    result(handle)?.status.rawValue ?? FQStatus.invalid.rawValue
}

@c @implementation
public func fq_result_error(_ handle: OpaquePointer?) -> UnsafePointer<CChar>? {
    result(handle)?.messageCString.map { UnsafePointer($0) }
}

@c @implementation
public func fq_result_value(_ handle: OpaquePointer?) -> UnsafeMutablePointer<json_t>? {
    result(handle)?.value?.raw
}
