import CJansson
import FetchQ

/// Target (b): JSON Pointer parsing and resolution, results extraction, sorting and
/// de-duplication (JSONPointer, JSONSearch), each checked against an independent
/// oracle written from the documented rules.
///
/// Input: `<results pointer>\n<key pointer>\n<JSON document>`. Without two newlines
/// the whole input is the document, with the pointers "" and "/id".
public enum SearchTarget {
    public static func run(_ data: UnsafeRawBufferPointer) {
        let (lines, body) = splitLines(data, count: 2)
        let results = lines[1] == nil ? "" : lines[0]!
        let key = lines[1] ?? "/id"
        let document = lines[1] == nil ? data : body
        let resultsPointer = checkPointer(results)
        let keyPointer = checkPointer(key)
        guard let doc = try? JSONParser.parse(document, maxDepth: 128) else { return }
        if let p = resultsPointer { checkResolve(p, in: doc) }
        if let p = keyPointer { checkResolve(p, in: doc) }
        guard let resultsPointer, let keyPointer else { return }
        run(doc, results: resultsPointer, key: keyPointer)
    }

    /// Extract, then sort both ways and de-duplicate, checking every step.
    static func run(_ doc: JSONRef, results: JSONPointer, key: JSONPointer) {
        let selected = results.resolve(in: doc.pointer)
        let items: JSONRef
        do {
            items = try JSONSearch.extractArray(from: doc, at: results)
            require(selected == items.pointer, "extractArray returned another value than resolve")
        } catch {
            switch error.kind {
            case .notFound: require(selected == nil, "notFound, but \(results) resolves")
            case .notArray: require(selected != nil && selected!.pointee.type != JSON_ARRAY,
                                    "notArray for \(results), but it selects an array or nothing")
            }
            require(!error.message.isEmpty, "empty error message")
            // Sorting and merging a non-array must throw notArray.
            if let selected {
                let value = JSONRef(borrowed: selected)
                require((try? JSONSearch.sortItems(value, by: key)) == nil, "sortItems accepted a non-array")
                require((try? JSONSearch.dedupe([value], idPointer: key)) == nil, "dedupe accepted a non-array")
            }
            return
        }
        for descending in [false, true] {
            guard let sorted = try? JSONSearch.sortItems(items, by: key, descending: descending) else {
                require(false, "sortItems threw on an array")
                return
            }
            checkSorted(sorted, from: items, key: key, descending: descending)
        }
        guard let merged = try? JSONSearch.dedupe([items, items], idPointer: key) else {
            require(false, "dedupe threw on arrays")
            return
        }
        checkDeduped(merged, inputs: [items, items], key: key)
    }

    // MARK: - JSON Pointer

    /// Parses a pointer; when it is accepted its text round-trips exactly.
    static func checkPointer(_ text: String) -> JSONPointer? {
        let pointer: JSONPointer
        do {
            pointer = try JSONPointer(text)
        } catch {
            let bytes = Array(text.utf8)
            let escapesOK = !bytes.indices.contains { i in
                bytes[i] == UInt8(ascii: "~") && !(i + 1 < bytes.count && (bytes[i + 1] == 0x30 || bytes[i + 1] == 0x31))
            }
            require(!(bytes.isEmpty || (bytes[0] == UInt8(ascii: "/") && escapesOK)),
                    "valid pointer \(text.debugDescription) rejected: \(error)")
            return nil
        }
        require(text.isEmpty || text.utf8.first == UInt8(ascii: "/"), "accepted \(text.debugDescription)")
        require(pointer.description == text, "\(text.debugDescription) prints as \(pointer.description.debugDescription)")
        require(JSONPointer(tokens: pointer.tokens) == pointer, "tokens do not rebuild the pointer")
        require(text.isEmpty ? pointer.tokens.isEmpty : pointer.tokens.count == text.utf8.count(where: { $0 == UInt8(ascii: "/") }),
                "token count of \(text.debugDescription)")
        return pointer
    }

    /// Both resolve overloads agree with a step-by-step walk over the tokens.
    static func checkResolve(_ pointer: JSONPointer, in doc: JSONRef) {
        let raw = pointer.resolve(in: doc.pointer)
        let ref = pointer.resolve(in: doc)
        require(raw == ref?.pointer, "the two resolve overloads disagree")
        var current: UnsafeMutablePointer<json_t>? = doc.pointer
        for token in pointer.tokens {
            guard let value = current else { break }
            switch value.pointee.type {
            case JSON_OBJECT:
                let key = token.utf8.map { CChar(bitPattern: $0) } + [0]  // never an empty buffer
                current = key.withUnsafeBufferPointer { json_object_getn(value, $0.baseAddress!, $0.count - 1) }
            case JSON_ARRAY:
                let digits = token.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                if !token.isEmpty, digits, token == "0" || !token.hasPrefix("0"), let index = Int(token),
                   index < json_array_size(value) {
                    current = json_array_get(value, index)
                } else {
                    current = nil
                }
            default:
                current = nil
            }
        }
        require(raw == current, "resolve(\(pointer)) differs from the token walk")
    }

    // MARK: - Sorting

    /// Output is a permutation of the input, ordered by the documented rules, stable,
    /// with items missing the key last in input order.
    static func checkSorted(_ sorted: JSONRef, from items: JSONRef, key: JSONPointer, descending: Bool) {
        let n = json_array_size(items.pointer)
        require(json_array_size(sorted.pointer) == n, "sortItems changed the count")
        // Position of each input item (by identity; duplicates of one json_t allowed).
        var positions: [UnsafeMutablePointer<json_t>: [Int]] = [:]
        for i in 0..<n { positions[json_array_get(items.pointer, i)!, default: []].append(i) }
        var order: [Int] = []
        for i in 0..<n {
            let item = json_array_get(sorted.pointer, i)!
            guard var list = positions[item], !list.isEmpty else {
                require(false, "sortItems output item \(i) is not an input item")
                return
            }
            order.append(list.removeFirst())
            positions[item] = list
        }
        for i in 1..<max(1, n) {
            let a = order[i - 1], b = order[i]
            let ka = key.resolve(in: json_array_get(items.pointer, a)!)
            let kb = key.resolve(in: json_array_get(items.pointer, b)!)
            switch (ka, kb) {
            case (nil, nil):
                require(a < b, "items without the key are not in input order")
            case (nil, _):
                require(false, "an item without the key sorts before one with it")
            case (_, nil):
                break
            case (let x?, let y?):
                let c = descending ? compareKeys(y, x) : compareKeys(x, y)
                require(c < 0 || (c == 0 && a < b),
                        "order broken at \(i) (descending: \(descending)): \(dump(x)) then \(dump(y))")
            }
        }
    }

    /// null < booleans < numbers < strings < arrays < objects; false < true; numbers by
    /// exact value; strings by bytes; arrays (and objects) all equal.
    static func compareKeys(_ a: UnsafeMutablePointer<json_t>, _ b: UnsafeMutablePointer<json_t>) -> Int {
        func rank(_ v: UnsafeMutablePointer<json_t>) -> Int {
            switch v.pointee.type {
            case JSON_NULL: 0
            case JSON_TRUE, JSON_FALSE: 1
            case JSON_INTEGER, JSON_REAL: 2
            case JSON_STRING: 3
            case JSON_ARRAY: 4
            default: 5
            }
        }
        let (ra, rb) = (rank(a), rank(b))
        if ra != rb { return ra < rb ? -1 : 1 }
        switch ra {
        case 1:
            let (x, y) = (a.pointee.type == JSON_TRUE, b.pointee.type == JSON_TRUE)
            return x == y ? 0 : (x ? 1 : -1)
        case 2:
            return compareNumbers(a, b)
        case 3:
            let x = UnsafeRawBufferPointer(start: json_string_value(a), count: json_string_length(a))
            let y = UnsafeRawBufferPointer(start: json_string_value(b), count: json_string_length(b))
            return x.lexicographicallyPrecedes(y) ? -1 : (y.lexicographicallyPrecedes(x) ? 1 : 0)
        default:
            return 0
        }
    }

    /// Exact comparison of two JSON numbers (integer or real), as (sign, magnitude)
    /// decomposed without converting integers to Double.
    static func compareNumbers(_ a: UnsafeMutablePointer<json_t>, _ b: UnsafeMutablePointer<json_t>) -> Int {
        let ia = a.pointee.type == JSON_INTEGER, ib = b.pointee.type == JSON_INTEGER
        if ia && ib {
            let (x, y) = (json_integer_value(a), json_integer_value(b))
            return x < y ? -1 : (x > y ? 1 : 0)
        }
        if !ia && !ib {
            let (x, y) = (json_real_value(a), json_real_value(b))
            return x < y ? -1 : (x > y ? 1 : 0)
        }
        let (i, d, flip) = ia ? (Int64(json_integer_value(a)), json_real_value(b), 1)
                              : (Int64(json_integer_value(b)), json_real_value(a), -1)
        // Exact: compare i with floor(d) as an integer when d is within Int64's range.
        let c: Int
        if d >= 0x1p63 {
            c = -1
        } else if d < -0x1p63 {
            c = 1
        } else {
            let f = d.rounded(.down)
            let fi = Int64(f)
            if i < fi { c = -1 } else if i > fi { c = 1 } else { c = d > f ? -1 : 0 }
        }
        return c * flip
    }

    // MARK: - De-duplication

    /// Output = the input items in order, keeping the first item per canonical id and
    /// every item without an id (the pointer selects nothing, or `null`).
    static func checkDeduped(_ merged: JSONRef, inputs: [JSONRef], key: JSONPointer) {
        var expected: [UnsafeMutablePointer<json_t>] = []
        var seen = Set<[UInt8]>()
        for array in inputs {
            for i in 0..<json_array_size(array.pointer) {
                let item = json_array_get(array.pointer, i)!
                if let id = key.resolve(in: item), id.pointee.type != JSON_NULL,
                   !seen.insert(canonicalText(id)).inserted { continue }
                expected.append(item)
            }
        }
        let n = json_array_size(merged.pointer)
        require(n == expected.count, "dedupe kept \(n) items, expected \(expected.count)")
        for i in 0..<min(n, expected.count) {
            require(json_array_get(merged.pointer, i) == expected[i], "dedupe item \(i) differs")
        }
    }

    static func dump(_ v: UnsafeMutablePointer<json_t>) -> String {
        String(decoding: canonicalText(v).prefix(80), as: UTF8.self)
    }
}
