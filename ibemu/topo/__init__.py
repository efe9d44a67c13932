"""ibemu.topo"""
