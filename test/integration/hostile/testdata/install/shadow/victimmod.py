# Ships the victim package's top-level module: with one shared site dir
# it replaced the victim's for every tool.
WHO = "shadow"
