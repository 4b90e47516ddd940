import CJansson
import Testing

@testable import FetchQ

@Suite struct JSONRefTests {
    func refcount(_ value: UnsafeMutablePointer<json_t>) -> Int {
        Int(value.pointee.refcount)
    }

    @Test func ownedStealsAndBorrowedIncrements() throws {
        let raw = json_array()!
        json_incref(raw)  // our own reference, so we can watch the count
        do {
            let owner = try #require(JSONRef(owned: raw))
            #expect(refcount(raw) == 2)
            do {
                let second = JSONRef(borrowed: raw)
                #expect(refcount(raw) == 3)
                #expect(second.pointer == owner.pointer)
            }
            #expect(refcount(raw) == 2)
        }
        #expect(refcount(raw) == 1)
        json_decref(raw)
    }

    @Test func newReferenceIsPlusOne() {
        let value = JSONRef.object()
        let handed = value.newReference()
        #expect(refcount(value.pointer) == 2)
        json_decref(handed)
        #expect(refcount(value.pointer) == 1)
    }

    @Test func owningNullIsNil() {
        #expect(JSONRef(owned: nil) == nil)
        #expect(JSONRef(owned: json_loads("[", 0, nil)) == nil)  // jansson's failure result
        #expect(JSONRef(owned: json_true())?.boolValue == true)
    }

    @Test func dumpsCompactSortedAndIndented() throws {
        let value = try JSONParser.parse(#"{"b":[1,2],"a":"x"}"#, maxDepth: 4)
        #expect(value.dumps() == #"{"b":[1,2],"a":"x"}"#)
        #expect(value.dumps(sorted: true) == #"{"a":"x","b":[1,2]}"#)
        #expect(value.dumps(compact: false, sorted: true) == "{\n  \"a\": \"x\",\n  \"b\": [\n    1,\n    2\n  ]\n}")
        #expect(JSONRef.string("é\"\n").dumps() == "\"é\\\"\\n\"")
        #expect(JSONRef.integer(-7).dumps() == "-7")
        #expect(JSONRef.null().dumps() == "null")
        #expect(JSONRef.real(0.5)?.dumps() == "0.5")
        #expect(value.description == value.dumps())
    }

    @Test func constructorsAndAccessors() throws {
        #expect(JSONRef.string("").stringValue == "")
        #expect(JSONRef.string("a\u{0}b").stringValue == "a\u{0}b")
        #expect(JSONRef.string("a\u{0}b").dumps() == #""a\u0000b""#)
        #expect(JSONRef.integer(.max).integerValue == .max)
        #expect(JSONRef.integer(3).doubleValue == 3)
        #expect(JSONRef.real(.nan) == nil)
        #expect(JSONRef.real(.infinity) == nil)
        #expect(JSONRef.bool(false).boolValue == false)
        #expect(JSONRef.string("1").integerValue == nil)

        let object = JSONRef.object()
        let inner = JSONRef.array([.integer(1), .string("two")])
        object.set("list", inner)
        object.set("", .null())
        object.set("k\u{0}ey", .bool(true))
        #expect(object.count == 3)
        #expect(object["list"]?.pointer == inner.pointer)  // the same value, not a copy
        #expect(refcount(inner.pointer) == 2)  // `inner` and the object's member
        #expect(object[""]?.isNull == true)
        #expect(object["k\u{0}ey"]?.boolValue == true)
        #expect(object["k"] == nil)
        #expect(inner[1]?.stringValue == "two")
        #expect(inner[2] == nil)
        #expect(inner[-1] == nil)
        #expect(inner.elements.map { $0.dumps() } == ["1", #""two""#])
        #expect(JSONRef.integer(1).elements.isEmpty)
        #expect(JSONRef.string("abc").count == 0)
    }

    @Test func sharedAcrossTasksKeepsCountsBalanced() async throws {
        let document = try JSONParser.parse(#"[{"id":1},{"id":2},{"id":3}]"#, maxDepth: 4)
        let expected = document.dumps(sorted: true)
        let results = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var ok = true
                    for _ in 0..<2000 {
                        let items = document.elements  // incref/decref from many threads
                        ok = ok && items.count == 3 && document.dumps(sorted: true) == expected
                    }
                    return ok
                }
            }
            var all: [Bool] = []
            for await result in group { all.append(result) }
            return all
        }
        #expect(results == Array(repeating: true, count: 8))
        #expect(refcount(document.pointer) == 1)
        for item in document.elements {
            #expect(refcount(item.pointer) == 2)  // the array's reference and `item`
        }
    }
}
