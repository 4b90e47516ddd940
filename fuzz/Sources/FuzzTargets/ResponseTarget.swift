import CJansson
import FetchQ
import Glibc

/// Target (c): a response body through the engine's response path: JSONParser.parse
/// with the default depth limit, then for a search the results array by JSON Pointer,
/// sorted (NetworkJob+Response.swift, `SearchJob.value(from:)`), the merge of a
/// search-all (SearchAll.swift: dedupe then sort), and the encoding the C API hands out.
///
/// Input: the raw body bytes. The pointers are the test server's shapes
/// (Tests/support: /search, /corpus, /json) and the whole document.
public enum ResponseTarget {
    /// (results, id, sort) as a search endpoint would configure them.
    static let endpoints: [(JSONPointer, JSONPointer, JSONPointer?)] = [
        (try! JSONPointer("/results"), try! JSONPointer("/id"), try! JSONPointer("/created_at")),
        (try! JSONPointer("/items"), try! JSONPointer("/id"), try! JSONPointer("/value")),
        (try! JSONPointer(""), try! JSONPointer("/id"), nil),
    ]

    /// The engine's default "max_json_depth".
    static let defaultDepth = EngineConfig().network.maxJSONDepth

    public static func run(_ data: UnsafeRawBufferPointer) {
        let doc: JSONRef
        // "lazy_parse" trusts the validator to agree with the parse exactly.
        let valid = JSONParser.isValid(data, maxDepth: defaultDepth)
        do {
            doc = try JSONParser.parse(data, maxDepth: defaultDepth)
        } catch {
            require(!valid, "fqs_json_valid accepts what JSONParser.parse rejects: \(error)")
            checkParseError(error, data)
            return
        }
        require(valid, "fqs_json_valid rejects what JSONParser.parse accepts")
        checkParsed(doc, data)
        for (results, id, sort) in endpoints {
            searchValue(doc, query: "q", results: results, id: id, sort: sort)
        }
    }

    /// What `SearchJob.value(from:)` and `SearchAllFamily.merge` do with a parsed body.
    static func searchValue(_ doc: JSONRef, query: String, results: JSONPointer, id: JSONPointer, sort: JSONPointer?) {
        guard var items = try? JSONSearch.extractArray(from: doc, at: results) else { return }
        if let sort {
            guard let sorted = try? JSONSearch.sortItems(items, by: sort, descending: true) else {
                require(false, "sortItems threw on an array")
                return
            }
            items = sorted
        }
        let value = JSONRef.object()
        value.set("query", JSONRef.string(query))
        value.set("count", JSONRef.integer(Int64(items.count)))
        value.set("items", items)
        // The search-all merge of this result with itself: every id once.
        guard let merged = try? JSONSearch.dedupe([items, items], idPointer: id) else {
            require(false, "dedupe threw on arrays")
            return
        }
        require(merged.count >= min(items.count, 1) || items.count == 0, "dedupe lost every item")
        require(merged.count <= 2 * items.count, "dedupe invented items")
        // What the C API hands out must encode and read back equal.
        guard let text = value.dumpBytes(compact: true, sorted: true) else {
            require(false, "a search value cannot be encoded")
            return
        }
        guard let back = try? JSONParser.parse(text, maxDepth: JSONParser.janssonMaxDepth) else {
            require(false, "the encoded search value does not parse: \(String(decoding: text.prefix(200), as: UTF8.self))")
            return
        }
        require(back.isEqual(to: value), "the search value does not round-trip")
    }

    /// A parsed document: within the depth limit, and its encoding parses back equal.
    static func checkParsed(_ doc: JSONRef, _ data: UnsafeRawBufferPointer) {
        // JSONParser.parse builds valid input itself (fqs_json_build): the tree must be
        // jansson's own, key order, types and every double's bits included.
        var error = json_error_t()
        let reference = JSONRef(owned: json_loadb(data.baseAddress?.assumingMemoryBound(to: CChar.self), data.count,
                                                  Int(JSON_DECODE_ANY) | Int(JSON_ALLOW_NUL), &error))
        require(reference != nil, "parsed what json_loadb rejects")
        if let reference {
            require(json_equal(doc.pointer, reference.pointer) == 1, "the built tree is not json_equal to jansson's")
            require(exactText(doc) == exactText(reference), "the built tree differs from jansson's (order or bits)")
        }
        let d = depth(of: doc.pointer)
        require(d <= defaultDepth, "parsed a document of depth \(d) with maxDepth \(defaultDepth)")
        if d > 0 {
            require((try? JSONParser.parse(data, maxDepth: d - 1)) == nil, "depth \(d) accepted with maxDepth \(d - 1)")
        }
        guard let text = doc.dumpBytes(compact: true, sorted: false) else {
            require(false, "a parsed document cannot be encoded")
            return
        }
        guard let back = try? JSONParser.parse(text, maxDepth: defaultDepth) else {
            require(false, "the encoding of a parsed document does not parse")
            return
        }
        require(back.isEqual(to: doc), "a parsed document does not round-trip through its encoding")
    }

    /// Text that tells apart key order, integers from reals and any two doubles.
    static func exactText(_ value: JSONRef) -> String? {
        let flags = Int(JSON_ENCODE_ANY) | Int(JSON_COMPACT) | (17 << 11)  // JSON_REAL_PRECISION(17)
        guard let text = json_dumps(value.pointer, flags) else { return nil }
        defer { free(text) }
        return String(cString: text)
    }

    /// A rejected body: a located, non-empty message; `.depth` only when nesting (counted
    /// outside strings) exceeds the limit.
    static func checkParseError(_ error: JSONParseError, _ data: UnsafeRawBufferPointer) {
        require(!error.message.isEmpty, "empty parse error message")
        require(error.position <= data.count + 1, "error position \(error.position) past the end (\(data.count))")
        _ = error.description
        if error.kind == .depth {
            require((try? JSONParser.parse(data, maxDepth: JSONParser.janssonMaxDepth)).map { depth(of: $0.pointer) > defaultDepth } ?? true,
                    "a .depth error for a document within the limit")
        }
    }
}
