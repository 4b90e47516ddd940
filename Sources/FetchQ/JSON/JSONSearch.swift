import CJansson
import Glibc

/// A search result document that does not have the expected shape.
public struct JSONSearchError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was wrong.
    public enum Kind: Sendable, Equatable {
        /// The pointer selects nothing in the document.
        case notFound
        /// The value is not an array.
        case notArray
    }

    /// What was wrong.
    public let kind: Kind
    /// Human-readable reason; names the pointer involved.
    public let message: String

    /// Creates an error.
    public init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
    }

    /// The message.
    public var description: String { message }
}

/// Pure functions over jansson values used by the search operations: pick the results
/// array out of a response, sort it by a field, merge several result lists without
/// duplicates.
///
/// None of them copies an item: the arrays they return hold new references to the input
/// items (`json_array_append` increments the count). Their inputs are only read, so they
/// may run on shared values from any thread (see ``JSONRef``).
public enum JSONSearch {
    /// The array that `pointer` selects in `document` (the same jansson value, with a new
    /// reference; not a copy).
    ///
    /// Throws `.notFound` if the pointer selects nothing and `.notArray` if it selects
    /// something else; the message names the pointer and, for `.notArray`, the type found.
    public static func extractArray(from document: JSONRef, at pointer: JSONPointer)
        throws(JSONSearchError) -> JSONRef
    {
        guard let found = pointer.resolve(in: document) else {
            throw JSONSearchError(
                kind: .notFound,
                message: "JSON pointer \(JSONPointer.quoted(pointer.description)) "
                    + "selects nothing in the response")
        }
        guard found.isArray else {
            throw JSONSearchError(
                kind: .notArray,
                message: "JSON pointer \(JSONPointer.quoted(pointer.description)) selects "
                    + "\(typeName(found.type)), not an array")
        }
        return found
    }

    /// A new array with the items of `array` ordered by the value `key` selects in each
    /// item. O(n log n); items are referenced, not copied; `array` is not modified.
    ///
    /// Ordering rules:
    /// - Items where `key` selects nothing come **last, in both directions**, in input
    ///   order.
    /// - Other items are ordered first by type rank,
    ///   `null` < booleans < numbers < strings < arrays < objects,
    ///   then within a type: `false` < `true`; numbers by numeric value (integers and reals
    ///   compared exactly, so `2` < `2.5` < `3`); strings by their UTF-8 bytes (so
    ///   ISO-8601 timestamps in one format sort chronologically); arrays and objects are
    ///   all equal to each other.
    /// - `descending` reverses that order (type rank included); missing keys stay last.
    /// - The sort is stable: items with equal keys keep their input order in both
    ///   directions.
    ///
    /// Throws `.notArray` if `array` is not an array.
    public static func sortItems(_ array: JSONRef, by key: JSONPointer, descending: Bool = false)
        throws(JSONSearchError) -> JSONRef
    {
        guard array.isArray else {
            throw JSONSearchError(
                kind: .notArray, message: "cannot sort \(typeName(array.type)), not an array")
        }
        return withExtendedLifetime(array) {
            let source = array.pointer
            let count = json_array_size(source)
            var items: [UnsafeMutablePointer<json_t>] = []
            var keys: [UnsafeMutablePointer<json_t>?] = []
            items.reserveCapacity(count)
            keys.reserveCapacity(count)
            for i in 0..<count {
                let item = json_array_get(source, i)!
                items.append(item)
                keys.append(key.resolve(in: item))
            }
            let order = sortOrder(keys, descending: descending)
            let result = JSONRef.array()
            for i in order {
                if json_array_append(result.pointer, items[i]) != 0 {
                    fatalError("jansson: out of memory")
                }
            }
            return result
        }
    }

    /// A new array with the items of `arrays`, in order, keeping only the first item for
    /// each id. O(total items × id size); items are referenced, not copied.
    ///
    /// - The id of an item is the value `idPointer` selects in it. Ids are compared by
    ///   their canonical JSON text (compact, keys sorted), so `"1"` and `1` are different
    ///   ids, `1` and `1.0` are different ids, and `{"a":1,"b":2}` equals `{"b":2,"a":1}`.
    /// - Items without an id (the pointer selects nothing, e.g. the field is absent or the
    ///   item is not an object, or it selects `null`, which the item store does not take
    ///   for an id either) are all kept, in place: nothing says they are duplicates.
    ///
    /// Throws `.notArray` if one of `arrays` is not an array (the message gives its index).
    public static func dedupe(_ arrays: [JSONRef], idPointer: JSONPointer)
        throws(JSONSearchError) -> JSONRef
    {
        for (index, array) in arrays.enumerated() where !array.isArray {
            throw JSONSearchError(
                kind: .notArray,
                message: "cannot merge input \(index): \(typeName(array.type)), not an array")
        }
        let result = JSONRef.array()
        var seen = Set<[UInt8]>()
        withExtendedLifetime(arrays) {
            for array in arrays {
                let count = json_array_size(array.pointer)
                for i in 0..<count {
                    let item = json_array_get(array.pointer, i)!
                    if let id = idPointer.resolve(in: item), jsonType(of: id) != JSON_NULL {
                        guard seen.insert(canonicalKey(id)).inserted else { continue }
                    }
                    if json_array_append(result.pointer, item) != 0 {
                        fatalError("jansson: out of memory")
                    }
                }
            }
        }
        return result
    }

    /// The positions of `keys` (nil: missing) in the order ``sortItems(_:by:descending:)``
    /// gives items with these keys. The values must stay alive meanwhile.
    static func sortOrder(_ values: [UnsafeMutablePointer<json_t>?], descending: Bool) -> [Int] {
        let keys = values.map(SortKey.init)
        var order = Array(0..<keys.count)
        order.sort { a, b in
            let ka = keys[a]
            let kb = keys[b]
            let aMissing = ka.isMissing
            let bMissing = kb.isMissing
            if aMissing || bMissing {
                if aMissing && bMissing { return a < b }
                return bMissing
            }
            let c = descending ? SortKey.compare(kb, ka) : SortKey.compare(ka, kb)
            return c != 0 ? c < 0 : a < b  // ties by input position: stable
        }
        return order
    }

    /// Variadic form of ``dedupe(_:idPointer:)``.
    public static func dedupe(_ arrays: JSONRef..., idPointer: JSONPointer)
        throws(JSONSearchError) -> JSONRef
    {
        try dedupe(arrays, idPointer: idPointer)
    }

    /// A byte string equal for two values exactly when their canonical JSON texts are
    /// equal. Strings and integers take a fast path (no encoder call); the leading tag
    /// keeps the three forms apart.
    static func canonicalKey(_ value: UnsafeMutablePointer<json_t>) -> [UInt8] {
        switch jsonType(of: value) {
        case JSON_STRING:
            // The JSON encoding of a string is a function of its bytes and vice versa.
            var key: [UInt8] = [UInt8(ascii: "s")]
            let length = json_string_length(value)
            if let chars = json_string_value(value) {
                key.append(contentsOf: UnsafeRawBufferPointer(start: chars, count: length))
            }
            return key
        case JSON_INTEGER:
            var key: [UInt8] = [UInt8(ascii: "i")]
            key.append(contentsOf: String(json_integer_value(value)).utf8)
            return key
        default:
            var key: [UInt8] = [UInt8(ascii: "j")]
            key.append(contentsOf: JSONRef.dumpBytes(value, compact: true, sorted: true) ?? [])
            return key
        }
    }

    static func typeName(_ type: json_type) -> String {
        switch type {
        case JSON_OBJECT: return "an object"
        case JSON_ARRAY: return "an array"
        case JSON_STRING: return "a string"
        case JSON_INTEGER, JSON_REAL: return "a number"
        case JSON_TRUE, JSON_FALSE: return "a boolean"
        default: return "null"
        }
    }
}

/// The part of an item that sorting looks at, extracted once per item.
/// String bytes are borrowed from the item, which the array being sorted keeps alive.
private enum SortKey {
    case missing
    case null
    case bool(Bool)
    case integer(Int64)
    case real(Double)
    case string(UnsafeRawBufferPointer)
    case array
    case object

    init(_ value: UnsafeMutablePointer<json_t>?) {
        guard let value else {
            self = .missing
            return
        }
        switch jsonType(of: value) {
        case JSON_NULL: self = .null
        case JSON_TRUE: self = .bool(true)
        case JSON_FALSE: self = .bool(false)
        case JSON_INTEGER: self = .integer(Int64(json_integer_value(value)))
        case JSON_REAL: self = .real(json_real_value(value))
        case JSON_STRING:
            self = .string(
                UnsafeRawBufferPointer(
                    start: json_string_value(value), count: json_string_length(value)))
        case JSON_ARRAY: self = .array
        default: self = .object
        }
    }

    var isMissing: Bool {
        if case .missing = self { return true }
        return false
    }

    /// null < booleans < numbers < strings < arrays < objects.
    var rank: Int {
        switch self {
        case .missing: return 6
        case .null: return 0
        case .bool: return 1
        case .integer, .real: return 2
        case .string: return 3
        case .array: return 4
        case .object: return 5
        }
    }

    /// -1, 0 or 1. Neither side is `.missing` (the caller handles that).
    static func compare(_ a: SortKey, _ b: SortKey) -> Int {
        switch (a, b) {
        case (.bool(let x), .bool(let y)):
            return x == y ? 0 : (x ? 1 : -1)
        case (.integer(let x), .integer(let y)):
            return x < y ? -1 : (x > y ? 1 : 0)
        case (.real(let x), .real(let y)):
            return x < y ? -1 : (x > y ? 1 : 0)
        case (.integer(let x), .real(let y)):
            return compareExact(x, y)
        case (.real(let x), .integer(let y)):
            return -compareExact(y, x)
        case (.string(let x), .string(let y)):
            return compareBytes(x, y)
        default:
            let (ra, rb) = (a.rank, b.rank)
            return ra < rb ? -1 : (ra > rb ? 1 : 0)
        }
    }

    /// Compares an integer with a finite double without the rounding of `Double(i)`.
    static func compareExact(_ i: Int64, _ d: Double) -> Int {
        if d >= 9_223_372_036_854_775_808.0 { return -1 }  // 2^63: above every Int64
        if d < -9_223_372_036_854_775_808.0 { return 1 }
        let whole = d.rounded(.towardZero)  // in [-2^63, 2^63): exact as Int64
        let w = Int64(whole)
        if i != w { return i < w ? -1 : 1 }
        let fraction = d - whole
        return fraction > 0 ? -1 : (fraction < 0 ? 1 : 0)
    }

    /// Lexicographic byte order; a proper prefix sorts first.
    static func compareBytes(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
        let n = min(a.count, b.count)
        if n > 0, let pa = a.baseAddress, let pb = b.baseAddress {
            let c = memcmp(pa, pb, n)
            if c != 0 { return c < 0 ? -1 : 1 }
        }
        return a.count < b.count ? -1 : (a.count > b.count ? 1 : 0)
    }
}
