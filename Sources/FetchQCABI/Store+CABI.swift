import CFetchQ
import CJansson
import FetchQ

func store(_ handle: OpaquePointer?) -> ItemStore? {
    handle.map { Unmanaged<ItemStore>.fromOpaque(UnsafeRawPointer($0)).takeUnretainedValue() }
}

/// Parses a JSON Pointer argument.
func pointer(_ text: String) throws(FetchQError) -> JSONPointer {
    do {
        return try JSONPointer(text)
    } catch {
        throw FetchQError(.invalid, "\"\(text)\" is not a JSON Pointer: \(error)")
    }
}

@c @implementation
public func fq_store_open(_ path: UnsafePointer<CChar>?, _ errbuf: UnsafeMutablePointer<CChar>?, _ errlen: Int) -> OpaquePointer? {
    do throws(FetchQError) {
        guard let path else { throw FetchQError(.invalid, "NULL path") }
        return OpaquePointer(Unmanaged.passRetained(try ItemStore.shared(path: try utf8(path, "the path"))).toOpaque())
    } catch {
        _ = fail(error)
        copyMessage(error.message, into: errbuf, errlen)
        return nil
    }
}

@c @implementation
public func fq_store_free(_ handle: OpaquePointer?) {
    guard let handle else { return }
    Unmanaged<ItemStore>.fromOpaque(UnsafeRawPointer(handle)).release()
}

@c @implementation
public func fq_store_items(_ handle: OpaquePointer?, _ collection: UnsafePointer<CChar>?, _ sort: UnsafePointer<CChar>?,
                           _ descending: Bool) -> UnsafeMutablePointer<json_t>? {
    do throws(FetchQError) {
        guard let s = store(handle), let collection else { throw nullHandle }
        let sortPointer = try sort.map { p throws(FetchQError) in try pointer(try utf8(p, "sort")) }
        return try s.items(collection: try utf8(collection, "the collection"), sortedBy: sortPointer,
                           descending: descending).newReference()
    } catch {
        _ = fail(error)
        return nil
    }
}

@c @implementation
public func fq_store_get(_ handle: OpaquePointer?, _ collection: UnsafePointer<CChar>?, _ id: UnsafePointer<CChar>?,
                         _ item: UnsafeMutablePointer<UnsafeMutablePointer<json_t>?>?) -> Int32 {
    item?.pointee = nil
    guard let s = store(handle), let collection, let id, let item else {
        return fail(.invalid, "NULL store, collection, id or item")
    }
    return status { () throws(FetchQError) in
        item.pointee = try s.item(collection: try utf8(collection, "the collection"), id: try utf8(id, "the id"))?
            .newReference()
    }
}

@c @implementation
public func fq_store_count(_ handle: OpaquePointer?, _ collection: UnsafePointer<CChar>?) -> Int64 {
    guard let s = store(handle), let collection else { return Int64(fail(nullHandle)) }
    do throws(FetchQError) {
        return Int64(try s.count(collection: try utf8(collection, "the collection")))
    } catch {
        return Int64(fail(error))
    }
}

@c @implementation
public func fq_store_upsert(_ handle: OpaquePointer?, _ collection: UnsafePointer<CChar>?, _ items: UnsafePointer<json_t>?,
                            _ idPointer: UnsafePointer<CChar>?, _ merge: UnsafePointer<CChar>?,
                            _ report: UnsafeMutablePointer<UnsafeMutablePointer<json_t>?>?) -> Int32 {
    report?.pointee = nil
    guard let s = store(handle), let collection, let items, let idPointer else {
        return fail(.invalid, "NULL store, collection, items or id_pointer")
    }
    return status { () throws(FetchQError) in
        let name = try utf8(collection, "the collection")
        let idText = try utf8(idPointer, "id_pointer")
        let mergeName = try merge.map { m throws(FetchQError) in try utf8(m, "merge") } ?? "overwrite"
        guard let policy = ItemStore.Merge(rawValue: mergeName) else {
            throw FetchQError(.invalid, "merge: \"\(mergeName)\" is not \"overwrite\" or \"keep-local\"")
        }
        let r = try s.upsert(collection: name, items: JSONRef(borrowed: UnsafeMutablePointer(mutating: items)),
                             idPointer: try pointer(idText), merge: policy)
        report?.pointee = r.json().newReference()
    }
}

@c @implementation
public func fq_store_get_json(_ handle: OpaquePointer?, _ collection: UnsafePointer<CChar>?, _ id: UnsafePointer<json_t>?,
                              _ item: UnsafeMutablePointer<UnsafeMutablePointer<json_t>?>?) -> Int32 {
    item?.pointee = nil
    guard let s = store(handle), let collection, let id, let item else {
        return fail(.invalid, "NULL store, collection, id or item")
    }
    return status { () throws(FetchQError) in
        item.pointee = try s.item(collection: try utf8(collection, "the collection"), id: JSONRef(borrowed: UnsafeMutablePointer(mutating: id)))?.newReference()
    }
}
