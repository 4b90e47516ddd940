// swift-tools-version:5.9
// The Foundation anchors of BENCHMARKS.md, kept out of the main package
// (which has no Foundation): Foundation's OperationQueue for P1, and the
// seeds' design — OperationQueue + URLSession + JSONSerialization — for P7.
import PackageDescription

let package = Package(
    name: "fetchq-bench-anchors",
    targets: [
        .executableTarget(name: "anchors", path: "Sources/anchors"),
    ]
)
