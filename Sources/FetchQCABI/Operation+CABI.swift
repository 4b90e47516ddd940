import CFetchQ
import CJansson
import FetchQ

/// Wraps a C completion function as a Swift completion.
func callback(_ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> Callback {
    guard let done else { return .none }
    return .c(done, userdata)
}

/// The n C strings of an array argument called `what`, copied; nil (the
/// last error set, naming the entry) when one is NULL or not UTF-8.
func strings(_ array: UnsafePointer<UnsafePointer<CChar>?>, _ n: Int, _ what: String) -> [String]? {
    // Reserved for at most 4 096: `n` is the caller's word until the array
    // is read, and reserving for n = 2^40 aborted the process (for 2^63 - 1
    // the size wrapped: a tiny buffer, and a corrupted heap; the tenth
    // review). The entries are read one by one; a NULL ends the call.
    var list: [String] = []
    list.reserveCapacity(min(n, 4096))
    for i in 0..<n {
        guard let p = array[i] else {
            _ = fail(.invalid, "\(what)[\(i)] is NULL")
            return nil
        }
        do {
            list.append(try utf8(p, "\(what)[\(i)]"))
        } catch {
            _ = fail(error)
            return nil
        }
    }
    return list
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
    return submitted { () throws(FetchQError) in
        try q.engine.submit(.cBlock(fn, userdata), to: q, options: options, callback: callback(done, userdata))
    }
}

@c @implementation
public func fq_submit_async(_ handle: OpaquePointer?, _ fn: fq_async_fn?, _ options: UnsafePointer<json_t>?,
                            _ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    guard let q = queue(handle), let fn else { return fq_op_id(fail(.invalid, "NULL queue or function")) }
    return submitted { () throws(FetchQError) in
        try q.engine.submit(.cAsync(fn, userdata), to: q, options: options, callback: callback(done, userdata))
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
    let owned = JSONRef(owned: value)  // stolen: released here on any failure
    guard let op = operation(handle) else { return fail(nullHandle) }
    return status { () throws(FetchQError) in try op.finish(value: owned, error: string(error)) }
}

@c @implementation
public func fq_op_dependency_result(_ handle: OpaquePointer?, _ dep: fq_op_id) -> UnsafeMutablePointer<json_t>? {
    operation(handle)?.dependencyResult(dep)?.pointer
}

@c @implementation
public func fq_op_dependency(_ handle: OpaquePointer?, _ dep: fq_op_id) -> OpaquePointer? {
    (operation(handle)?.dependency(dep)).map { OpaquePointer(Unmanaged.passUnretained($0).toOpaque()) }
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
    result(handle)?.value?.pointer
}

@c @implementation
public func fq_result_has_value(_ handle: OpaquePointer?) -> Bool { result(handle)?.hasValue ?? false }

@c @implementation
public func fq_result_retain(_ handle: OpaquePointer?) -> OpaquePointer? {
    guard let handle else { return nil }
    _ = Unmanaged<OperationResult>.fromOpaque(UnsafeRawPointer(handle)).retain()
    return handle
}

@c @implementation
public func fq_result_release(_ handle: OpaquePointer?) {
    guard let handle else { return }
    Unmanaged<OperationResult>.fromOpaque(UnsafeRawPointer(handle)).release()
}

@c @implementation
public func fq_submit_request(_ handle: OpaquePointer?, _ request: UnsafePointer<json_t>?, _ options: UnsafePointer<json_t>?,
                              _ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    guard let q = queue(handle) else { return fq_op_id(fail(nullHandle)) }
    return submitted { () throws(FetchQError) in
        try q.engine.submitRequest(request, to: q, options: options, callback: callback(done, userdata))
    }
}

@c @implementation
public func fq_submit_requests(_ handle: OpaquePointer?, _ request: UnsafePointer<json_t>?,
                               _ urls: UnsafePointer<UnsafePointer<CChar>?>?, _ n: Int, _ options: UnsafePointer<json_t>?,
                               _ done: fq_completion_fn?, _ userdata: UnsafePointer<UnsafeMutableRawPointer?>?,
                               _ ids: UnsafeMutablePointer<fq_op_id>?) -> Int64 {
    guard let q = queue(handle) else { return Int64(fail(nullHandle)) }
    guard n >= 0 else { return Int64(fail(.invalid, "n is larger than any array can be")) }  // size_t above Int.max
    guard n > 0 else { return 0 }
    guard let urls else { return Int64(fail(.invalid, "urls is NULL")) }
    guard let list = strings(urls, n, "urls") else { return Int64(FQStatus.invalid.rawValue) }
    do {
        let (submitted, stopped) = try q.engine.submitRequests(request, urls: list, to: q, options: options) { i in
            callback(done, userdata?[i])
        }
        if let ids { for (i, id) in submitted.enumerated() { ids[i] = id } }
        if let stopped { _ = fail(stopped) }
        return Int64(submitted.count)
    } catch {
        return Int64(fail(error))
    }
}

@c @implementation
public func fq_submit_search(_ handle: OpaquePointer?, _ query: UnsafePointer<CChar>?, _ options: UnsafePointer<json_t>?,
                             _ done: fq_completion_fn?, _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    guard let q = queue(handle), let query else { return fq_op_id(fail(.invalid, "NULL queue or query")) }
    return submitted { () throws(FetchQError) in
        try q.engine.submitSearch(try utf8(query, "the query"), to: q, options: options, callback: callback(done, userdata))
    }
}

@c @implementation
public func fq_result_http_status(_ handle: OpaquePointer?) -> Int { result(handle)?.http?.status ?? 0 }

@c @implementation
public func fq_result_headers(_ handle: OpaquePointer?) -> UnsafeMutablePointer<json_t>? {
    result(handle)?.http?.headers?.pointer
}

@c @implementation
public func fq_result_body(_ handle: OpaquePointer?, _ length: UnsafeMutablePointer<Int>?) -> UnsafePointer<UInt8>? {
    let body = result(handle)?.bodyBytes
    length?.pointee = body?.count ?? 0
    return body?.baseAddress.map { UnsafePointer($0) }
}

@c @implementation
public func fq_result_marshal(_ handle: OpaquePointer?, _ length: UnsafeMutablePointer<Int>?) -> UnsafePointer<UInt8>? {
    let data = result(handle)?.marshalBytes
    length?.pointee = data?.count ?? 0
    return data?.baseAddress.map { UnsafePointer($0) }
}

@c @implementation
public func fq_result_metrics(_ handle: OpaquePointer?) -> UnsafeMutablePointer<json_t>? {
    result(handle)?.http?.metrics?.pointer
}

@c @implementation
public func fq_engine_set_event_fn(_ handle: OpaquePointer?, _ fn: fq_event_fn?, _ userdata: UnsafeMutableRawPointer?) -> Int32 {
    guard let e = engine(handle) else { return fail(nullHandle) }
    let ud = UserData(pointer: userdata)
    guard let fn else {
        e.setEventHandler(nil)
        return FQStatus.ok.rawValue
    }
    e.setEventHandler { (event: OperationEvent) in
        fn(OpaquePointer(Unmanaged.passUnretained(event).toOpaque()), ud.pointer)
    }
    return FQStatus.ok.rawValue
}

func event(_ handle: OpaquePointer?) -> OperationEvent? {
    handle.map { Unmanaged<OperationEvent>.fromOpaque(UnsafeRawPointer($0)).takeUnretainedValue() }
}

@c @implementation
public func fq_event_op_id(_ handle: OpaquePointer?) -> fq_op_id { event(handle)?.id ?? 0 }

@c @implementation
public func fq_event_get_type(_ handle: OpaquePointer?) -> fq_event_type {
    fq_event_type(rawValue: UInt32(event(handle)?.kind.rawValue ?? 0))
}

@c @implementation
public func fq_event_progress(_ handle: OpaquePointer?, _ received: UnsafeMutablePointer<UInt64>?,
                              _ expected: UnsafeMutablePointer<UInt64>?) -> Int32 {
    guard let e = event(handle) else { return fail(nullHandle) }
    received?.pointee = e.received
    expected?.pointee = e.expected
    return FQStatus.ok.rawValue
}

@c @implementation
public func fq_submit_search_all(_ handle: OpaquePointer?, _ queries: UnsafePointer<UnsafePointer<CChar>?>?, _ n: Int,
                                 _ options: UnsafePointer<json_t>?, _ done: fq_completion_fn?,
                                 _ userdata: UnsafeMutableRawPointer?) -> fq_op_id {
    // (n above INT64_MAX arrives negative: said so, not "n == 0".)
    guard n >= 0 else { return fq_op_id(fail(.invalid, "n is larger than any array can be")) }
    guard let q = queue(handle), let queries, n > 0 else {
        return fq_op_id(fail(.invalid, "NULL queue, NULL queries or n == 0"))
    }
    guard let list = strings(queries, n, "queries") else { return fq_op_id(FQStatus.invalid.rawValue) }
    return submitted { () throws(FetchQError) in
        try q.engine.submitSearchAll(list, to: q, options: options, callback: callback(done, userdata))
    }
}

@c @implementation
public func fq_event_result(_ handle: OpaquePointer?) -> OpaquePointer? {
    (event(handle)?.child).map { OpaquePointer(Unmanaged.passUnretained($0).toOpaque()) }
}

@c @implementation
public func fq_event_query(_ handle: OpaquePointer?) -> UnsafePointer<CChar>? {
    event(handle)?.queryCString.map { UnsafePointer($0) }
}

@c @implementation
public func fq_result_from_cache(_ handle: OpaquePointer?) -> Bool { result(handle)?.fromCache ?? false }
