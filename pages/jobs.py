import streamlit as st

st.title("jobs")
