"""No views: the chaos processes only publish and consume."""

urlpatterns: list = []
