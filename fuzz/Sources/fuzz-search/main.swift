import FuzzTargets

FuzzMain.run(name: "search", SearchTarget.run)
