import CJansson

/// Reads a JSON object of options strictly: every key must be read by
/// someone, with the right type, or `finish()` reports it. Errors name the
/// full key path (`options.retry.max`).
///
/// Runs for every submit, so lookups do not allocate: keys are passed to
/// jansson with `withCString` (the implicit String-to-pointer conversion built
/// a heap copy per lookup), and the keys read are kept in a small array.
struct OptionReader {
    private let object: UnsafeMutablePointer<json_t>?
    let context: String
    /// Keys present in the object that were read, each once.
    private var consumed = ReadKeys()
    /// The object's number of keys: once that many were read, no other key
    /// can be there, and lookups stop asking jansson (a submit asks for a
    /// dozen keys; most options objects hold one or two).
    private let size: Int

    /// `json` is borrowed; nil means "no options".
    init(_ json: UnsafePointer<json_t>?, context: String) throws(FetchQError) {
        self.context = context
        guard let json else {
            object = nil
            size = 0
            return
        }
        guard json.pointee.type == JSON_OBJECT else {
            throw FetchQError(.invalid, "\(context): expected a JSON object, got \(jsonTypeName(json))")
        }
        object = UnsafeMutablePointer(mutating: json)
        size = json_object_size(json)
    }

    /// The raw value (borrowed), marking the key as read.
    mutating func value(_ key: String) -> UnsafeMutablePointer<json_t>? {
        guard let object else { return nil }
        let seen = consumed.contains(key)
        if !seen && consumed.count == size { return nil }
        guard let v = key.withCString({ json_object_get(object, $0) }) else { return nil }
        if !seen { consumed.append(key) }
        return v
    }

    func path(_ key: String) -> String { "\(context).\(key)" }

    /// Every key of the object was read (true for no options at all).
    var allRead: Bool { consumed.count == size }

    /// Whether the key is present (without reading it).
    func has(_ key: String) -> Bool {
        guard let object else { return false }
        return key.withCString { json_object_get(object, $0) } != nil
    }

    func typeError(_ key: String, _ expected: String, _ got: UnsafePointer<json_t>) -> FetchQError {
        FetchQError(.invalid, "\(path(key)): expected \(expected), got \(jsonTypeName(got))")
    }

    mutating func int(_ key: String, in range: ClosedRange<Int>) throws(FetchQError) -> Int? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_INTEGER else { throw typeError(key, "an integer", v) }
        let n = json_integer_value(v)
        guard n >= Int64(range.lowerBound) && n <= Int64(range.upperBound) else {
            throw FetchQError(.invalid, "\(path(key)): \(n) is out of range \(range.lowerBound)...\(range.upperBound)")
        }
        return Int(n)
    }

    /// A number (integer or real) within `range`.
    mutating func number(_ key: String, in range: ClosedRange<Double>) throws(FetchQError) -> Double? {
        guard let v = value(key) else { return nil }
        let d: Double
        switch v.pointee.type {
        case JSON_INTEGER: d = Double(json_integer_value(v))
        case JSON_REAL: d = json_real_value(v)
        default: throw typeError(key, "a number", v)
        }
        guard range.contains(d) else {
            throw FetchQError(.invalid, "\(path(key)): \(d) is out of range \(range.lowerBound)...\(range.upperBound)")
        }
        return d
    }

    mutating func bool(_ key: String) throws(FetchQError) -> Bool? {
        guard let v = value(key) else { return nil }
        switch v.pointee.type {
        case JSON_TRUE: return true
        case JSON_FALSE: return false
        default: throw typeError(key, "true or false", v)
        }
    }

    mutating func string(_ key: String) throws(FetchQError) -> String? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_STRING else { throw typeError(key, "a string", v) }
        return jsonString(v)
    }

    mutating func choice(_ key: String, _ allowed: [String]) throws(FetchQError) -> String? {
        guard let s = try string(key) else { return nil }
        guard allowed.contains(s) else {
            throw FetchQError(.invalid, "\(path(key)): \"\(s)\" is not one of \(allowed.map { "\"\($0)\"" }.joined(separator: ", "))")
        }
        return s
    }

    /// A nested object, read with its own strict reader.
    mutating func object(_ key: String) throws(FetchQError) -> OptionReader? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_OBJECT else { throw typeError(key, "an object", v) }
        return try OptionReader(v, context: path(key))
    }

    /// Fails on the first key nobody read.
    func finish() throws(FetchQError) {
        guard let object else { return }
        // Every key read is a distinct key of the object: same count, none left.
        if consumed.count == json_object_size(object) { return }
        var iter = json_object_iter(object)
        while let it = iter {
            let key = String(cString: json_object_iter_key(it))
            if !consumed.contains(key) {
                throw FetchQError(.invalid, "\(context): unknown key \"\(key)\"")
            }
            iter = json_object_iter_next(object, it)
        }
    }
}

/// A jansson string value as a Swift String (embedded NULs kept; invalid
/// UTF-8 cannot occur: jansson validates).
func jsonString(_ v: UnsafePointer<json_t>) -> String {
    let length = json_string_length(v)
    guard let bytes = json_string_value(v) else { return "" }
    return bytes.withMemoryRebound(to: UInt8.self, capacity: length) {
        String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
    }
}

func jsonTypeName(_ v: UnsafePointer<json_t>) -> String {
    switch v.pointee.type {
    case JSON_OBJECT: "an object"
    case JSON_ARRAY: "an array"
    case JSON_STRING: "a string"
    case JSON_INTEGER: "an integer"
    case JSON_REAL: "a real number"
    case JSON_TRUE, JSON_FALSE: "a boolean"
    case JSON_NULL: "null"
    default: "an unknown JSON type"
    }
}

/// The keys an `OptionReader` has read. The first two are stored inline: most
/// options objects hold one or two keys, and an array cost an allocation per
/// submit.
private struct ReadKeys {
    private var first: String? = nil
    private var second: String? = nil
    private var more: [String] = []
    private(set) var count = 0

    func contains(_ key: String) -> Bool {
        first == key || second == key || (count > 2 && more.contains(key))
    }

    mutating func append(_ key: String) {
        switch count {
        case 0: first = key
        case 1: second = key
        default: more.append(key)
        }
        count += 1
    }
}
